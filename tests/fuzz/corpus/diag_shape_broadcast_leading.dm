input x : f32[2, 3, 4]
input z : f32[5, 1, 4]
y = x * z
