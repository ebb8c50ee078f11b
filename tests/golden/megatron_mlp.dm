# megatron_mlp.dm: a residual MLP block sharded as in Megatron-LM: the first weight split
# by columns and the second by rows over `tensor` (one allreduce forward, one backward),
# the batch split over `data` (gradients allreduced). Golden plans in run_golden.py.
dim B = 16
dim T = 8
dim C = 64
mesh(data = 2, tensor = 2)

input x : f32[B@data, T, C]
input y : f32[B@data, T, C]

param w1 : f32[C, 4 * C@tensor] = normal(0, 0.02)
param b1 : f32[4 * C@tensor] = zeros
param w2 : f32[4 * C@tensor, C] = normal(0, 0.02)
param b2 : f32[C] = zeros
param ln_w : f32[C] = ones
param ln_b : f32[C] = zeros

h = layernorm(x, ln_w, ln_b)
u = gelu(h @ w1 + b1)          # [B, T, 4C@tensor]: no communication
z = x + (u @ w2 + b2)          # partial over tensor until the allreduce
d = z - y
loss = mean(d * d)

minimize loss
optimizer sgd(lr = 0.1)
