input x : f32[4@data, 3]
