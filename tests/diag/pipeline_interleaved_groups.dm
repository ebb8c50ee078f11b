# Micro-batches go through a rank's chunks in groups of the pipeline's size: 6 on 4 ranks cannot.
dim B = 12
mesh(pipeline = 4)
schedule interleaved(microbatches = 6, chunks = 2)
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
loss = cross_entropy(g, y)
minimize loss
optimizer sgd(lr = 0.1)
