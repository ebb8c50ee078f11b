dim B = 8
mesh(pipeline = 3)
schedule gpipe(microbatches = 2, cuts = [h])
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
loss = cross_entropy(g, y)
minimize loss
optimizer sgd(lr = 0.1)
