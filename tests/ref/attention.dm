# attention.dm: fused attention (passes/fuse_attention.c) at sizes that are not the
# kernel's tile of 64 positions; tests/ref/test_attention.py sets B, T, NH and HS and
# mirrors it in torch. Two attentions share q, k and v: one causal with gpt.dm's scale,
# one over every key with the scores multiplied by a constant (four ops, also fused).
dim B = 2
dim T = 67
dim NH = 3
dim HS = 5
dim C = NH * HS

input x : f32[B, T, C]
param wq : f32[C, C] = normal(0, 0.5)
param wk : f32[C, C] = normal(0, 0.5)
param wv : f32[C, C] = normal(0, 0.5)
param wo : f32[C, C] = normal(0, 0.5)

q = transpose(reshape(x @ wq, [B, T, NH, HS]), T, NH)              # [B, NH, T, HS]
k = transpose(reshape(x @ wk, [B, T, NH, HS]), T, NH)
v = transpose(reshape(x @ wv, [B, T, NH, HS]), T, NH)
causal = softmax(causal_mask(q @ transpose(k) / sqrt(HS)), -1) @ v
every = softmax(q @ transpose(k) * 0.5) @ v
y = reshape(transpose(causal + every, NH, T), [B, T, C]) @ wo
loss = mean(tanh(y) * y)

minimize loss
optimizer sgd(lr = 0.1)
