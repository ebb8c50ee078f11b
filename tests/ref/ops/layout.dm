# layout.dm: reshape (with -1) and transpose (2-D default, last two of rank 3/4, named
# and indexed dims), with parameters flowing through them; matmul of rank 3 and 4
# (tests/ref/test_ops.py).
dim B = 2
dim T = 3
dim NH = 2
dim C = 4
dim N = 5

input x : f32[B, T, C]
param wq : f32[C, C] = normal(0, 0.5)
param p : f32[C, T] = normal(0, 1)
param wo : f32[C / NH, N] = normal(0, 0.5)
param g : f32[T * N] = normal(0, 1)

h = x @ wq                                   # [B, T, C] @ [C, C]
q = reshape(h, [B, T, NH, C / NH])
qt = transpose(q, T, NH)                     # [B, NH, T, C / NH]
o = gelu(qt @ wo)                            # rank-4 @ [C / NH, N]: [B, NH, T, N]
flat = reshape(o, [B * NH, -1])              # [B * NH, T * N]
y1 = flat * g
pt = transpose(p)                            # [T, C]
x2 = x + pt                                  # [B, T, C]
y2 = transpose(x2, B, C)                     # [C, T, B]
y3 = transpose(tanh(y2))                     # [C, B, T]
y4 = transpose(y3, 0, -1) @ wq               # [T, B, C] @ [C, C]: wq used twice
loss = mean(y1 * y1) + mean(y4 * y4) + sum(reshape(y1, [-1])) / 50

minimize loss
optimizer sgd(lr = 0.1)
