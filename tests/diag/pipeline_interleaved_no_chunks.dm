# The interleaved schedule needs the model chunks each pipeline rank holds.
dim B = 8
mesh(pipeline = 2)
schedule interleaved(microbatches = 4)
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
loss = cross_entropy(g, y)
minimize loss
optimizer sgd(lr = 0.1)
