# repeat_kv.dm: repeating a tensor along a new dim, then merging dims: Hugging Face's
# repeat_kv (torch.repeat_interleave over the heads) for grouped-query attention, once by
# broadcasting against a table of zeros and once by expand; and expand of a [1, C] row
# to [B, T, C] (a new leading dim and a size-1 dim widened); an attention over k repeated
# by a merge that also folds the batch into the positions (no grouped-query attention:
# the fusion once refused it). Gradients sum over the repeats (tests/ref/test_ops.py).
dim B = 2
dim T = 3
dim C = 8
dim NH = 4
dim NKV = 2
dim HD = 2

input x : f32[B, T, C]
param wq : f32[C, C] = normal(0, 1)
param wk : f32[NKV * HD, C] = normal(0, 1)
param wrow : f32[1, C] = normal(0, 1)

q = permute(reshape(x @ transpose(wq), [B, T, NH, HD]), [0, 2, 1, 3])       # [B, NH, T, HD]
k = permute(reshape(x @ transpose(wk), [B, T, NKV, HD]), [0, 2, 1, 3])      # [B, NKV, T, HD]
k5 = reshape(k, [B, NKV, 1, T, HD]) + reshape(arange(NH / NKV) * 0, [NH / NKV, 1, 1])
kr = reshape(k5, [B, NH, T, HD])                                             # head h: k head h / 2
z = tanh(q @ transpose(kr))                                                  # [B, NH, T, T]
kx = reshape(expand(reshape(k, [B, NKV, 1, T, HD]), [B, NKV, NH / NKV, T, HD]), [B, NH, T, HD])
kb = reshape(expand(reshape(k, [B, NKV, 1, T, HD]), [B, NKV, NH / NKV, T, HD]), [1, NH, B * T, HD])
vb = reshape(expand(reshape(k * 2, [B, NKV, 1, T, HD]), [B, NKV, NH / NKV, T, HD]), [1, NH, B * T, HD])
ob = softmax(reshape(q, [1, NH, B * T, HD]) @ transpose(kb), -1) @ vb
loss = mean(z * z) + mean(kr * kr * kr) / 4 + mean(kx * kx * q) + mean(tanh(x * expand(wrow, [B, T, -1]))) + mean(ob * ob)

minimize loss
optimizer sgd(lr = 0.1)
