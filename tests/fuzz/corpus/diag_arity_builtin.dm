input x : f32[3]
y = relu(x, x)
