mesh(data = 2)
input x : f32[4@model, 3]
