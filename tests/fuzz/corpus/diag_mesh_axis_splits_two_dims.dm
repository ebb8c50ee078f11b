mesh(data = 2)
input x : f32[4@data, 4@data]
