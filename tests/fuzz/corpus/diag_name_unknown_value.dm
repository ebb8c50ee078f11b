input x : f32[4]
y = relu(z)
