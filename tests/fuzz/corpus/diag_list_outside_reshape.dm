input x : f32[3]
y = [x, x]
