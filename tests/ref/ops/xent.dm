# xent.dm: cross_entropy over rank-3 logits [B, T, V] with targets [B, T], plus a
# second loss term (tests/ref/test_ops.py).
dim B = 3
dim T = 4
dim C = 5
dim V = 7

input x : f32[B, T, C]
input y : i32[B, T]
param wte : f32[C, V] = normal(0, 1)
param b : f32[V] = zeros
param ln : f32[C] = ones

h = x * ln
logits = h @ wte + b
loss = cross_entropy(logits, y) + 0.01 * mean(logits * logits)

output logits
minimize loss
optimizer sgd(lr = 0.1)
