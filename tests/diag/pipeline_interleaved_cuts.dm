# With chunks the cuts make P x v stages: 2 ranks x 2 chunks need 3 cuts.
dim B = 8
mesh(pipeline = 2)
schedule interleaved(microbatches = 2, chunks = 2, cuts = [h])
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
k = tanh(g)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1)
