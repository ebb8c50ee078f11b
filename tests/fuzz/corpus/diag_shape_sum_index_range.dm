input x : f32[4, 6]
y = sum(x, 2)
