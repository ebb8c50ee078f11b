input x : f32[4, 6]
y = reshape(x, [5, -1])
