# tests/spmd/sgd.dm: a two-layer MLP trained by SGD with Nesterov momentum (one optimizer
# state tensor per parameter)
# (ZeRO splits that state over data: test_equivalence.py)
dim B = 16
dim D = 24
dim H = 32
dim K = 8

mesh(data = 1, tensor = 1)

input x : f32[B@data, D]
input y : i32[B@data]

param w1 : f32[D, H@tensor] = xavier
param b1 : f32[H@tensor] = zeros
param w2 : f32[H@tensor, K] = xavier
param b2 : f32[K] = zeros

h = relu(x @ w1 + b1)
logits = h @ w2 + b2
loss = cross_entropy(logits, y)

minimize loss
optimizer sgd(lr = 0.05, momentum = 0.9, nesterov = true, weight_decay = 1e-4)
