input x : f32[4]
y = softmax(x)
