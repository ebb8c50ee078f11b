input x : f32[4]
y = relu(x)
y = tanh(x)
