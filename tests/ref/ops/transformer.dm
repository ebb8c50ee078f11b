# transformer.dm: the GPT ops (tests/ref/test_ops.py): embedding lookup, layernorm with
# its eps, slices of the last and of a middle dim (with negative bounds), heads split
# and merged, batched matmul with a transposed right operand, sqrt of a dim, causal
# mask fused into a scaled softmax and on its own, a named scaled score under the mask
# that is read again (the fusion must leave the name its value), softmax over the last and over a
# middle dim, sqrt, and a head tied to the embedding table.
dim B = 2
dim T = 5
dim C = 6
dim V = 7
dim NH = 2

input ids : i32[B, T]
param table : f32[V, C] = normal(0, 1)
param lnw : f32[C] = ones
param lnb : f32[C] = zeros
param wqkv : f32[C, 3 * C] = normal(0, 0.5)
param w2 : f32[T, C] = normal(0, 1)

e = embed(table, ids)                                             # [B, T, C]
n = layernorm(e, lnw, lnb, eps = 1e-3)
qkv = n @ wqkv                                                    # [B, T, 3C]
q = transpose(reshape(slice(qkv, -1, 0, C), [B, T, NH, C / NH]), T, NH)
k = transpose(reshape(slice(qkv, 2, C, 2 * C), [B, T, NH, C / NH]), T, NH)
v = transpose(reshape(slice(qkv, -1, -C, 3 * C), [B, T, NH, C / NH]), T, NH)
att = softmax(causal_mask(q @ transpose(k) / sqrt(C / NH)), -1)    # [B, NH, T, T], fused
masked = causal_mask(q @ transpose(v)) * 0.5                      # a mask on its own
att2 = softmax(masked)
sc = q @ transpose(k) / 2                                         # named, read again below
att3 = softmax(causal_mask(sc), -1)
y = reshape(transpose(att @ v, NH, T), [B, T, C])
s2 = softmax(y * w2, T)                                           # over a middle dim
m = slice(e, T, 1, -1)                                            # [B, T - 2, C]
logits = (y + s2) @ transpose(table)                              # tied head: [B, T, V]
extra = mean(att3 * att3) + mean(sc * sc)
loss = cross_entropy(logits, ids) + mean(m * m) + mean(sqrt(s2 + 1)) + mean(att2 * att2) + extra

minimize loss
optimizer sgd(lr = 0.1)
