input x : f32[4]
y = relu(x) $ 2
