# tests/spmd/clip.dm: gradient clipping and a learning-rate schedule on every mesh
# (test_equivalence.py). The global norm must count each gradient element once: w1 and
# b1 are split over tensor, w2 split on its rows, b2, w3 and b3 a copy on every tensor
# rank; data replicas hold equal gradients after the allreduce, ZeRO holds shares, and
# pipeline stages hold disjoint parameters. clip is small enough to act at every step,
# and SGD passes the clipped gradient straight into the weights. Its weight decay spares
# the biases (weight_decay_1d = false): every ZeRO share, tensor block and pipeline stage
# decays its matrices' elements alone, as the serial program does.
dim B = 16
dim D = 24
dim H = 32
dim K = 8

mesh(data = 1, tensor = 1, pipeline = 1)

input x : f32[B@data, D]
input y : i32[B@data]

param w1 : f32[D, H@tensor] = xavier
param b1 : f32[H@tensor] = zeros
param w2 : f32[H@tensor, H] = xavier
param b2 : f32[H] = zeros
param w3 : f32[H, K] = xavier
param b3 : f32[K] = zeros

h1 = relu(x @ w1 + b1)
h2 = relu(h1 @ w2 + b2)
logits = h2 @ w3 + b3
loss = cross_entropy(logits, y)

minimize loss
optimizer sgd(lr = 0.1, momentum = 0.9, weight_decay = 0.05, weight_decay_1d = false, warmup = 3, decay = cosine, min_lr = 0.01, clip = 0.25)
