input x : f32[4]
y = transpose(x)
