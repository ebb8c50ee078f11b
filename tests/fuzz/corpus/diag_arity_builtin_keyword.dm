input x : f32[3]
y = tanh(x = 1)
