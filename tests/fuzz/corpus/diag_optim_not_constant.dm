input x : f32[3]
optimizer sgd(lr = x)
