mesh(data = 4)
dim B = 6
input x : f32[B@data, 3]
