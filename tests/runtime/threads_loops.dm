# threads_loops.dm: a byte-level model with every kind of kernel the C target splits over
# a rank's threads but the matrix products (tests/runtime/test_threads.py): embedding and
# its gradient, a broadcast add and its sum over the batch, layernorm, GELU, softmax over
# the last and over a middle dim, a bias's sum over rows, cross-entropy and AdamW. Every
# loop has at least 2^15 elements, so that each is split.
dim B = 8
dim T = 64
dim V = 256

input tokens  : i32[B, T]
input targets : i32[B, T]
param table : f32[V, V] = normal(0, 0.1)
param pos   : f32[T, V] = normal(0, 0.1)
param lnw   : f32[V] = ones
param lnb   : f32[V] = zeros
param bias  : f32[V] = zeros

e = embed(table, tokens) + pos                        # [B, T, V]
n = layernorm(e, lnw, lnb, eps = 1e-5)
h = gelu(n) + bias
logits = h + softmax(h * 0.5, -1) * 2.0 + softmax(h, T)
loss = cross_entropy(logits, targets)

output logits
minimize loss
optimizer adamw(lr = 1e-2, weight_decay = 0.01)
