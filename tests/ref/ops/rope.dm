# rope.dm: LLaMA's rotary embedding, as torch writes it: heads permuted out and back
# (permute by name and by index, a 3-cycle), cos and sin of an angle table made by
# concat of one parameter with itself, rotate_half(x) = concat(-x2, x1, dim = -1), a
# three-way concat along a middle dim (named), sin and cos of constants, and a RoPE
# table computed in the program from arange (tests/ref/test_ops.py).
dim B = 2
dim T = 3
dim NH = 2
dim HD = 4
dim C = NH * HD

input x : f32[B, T, C]
param wq : f32[C, C] = normal(0, 0.5)
param f : f32[T, HD / 2] = normal(0, 1)
param g : f32[B, 2 * T] = normal(0, 1)

q = reshape(x @ wq, [B, T, NH, HD])
qh = permute(q, [B, NH, T, HD])              # [B, NH, T, HD]
ang = concat(f, f, dim = -1)                 # [T, HD]: the same parameter twice
x1 = slice(qh, -1, 0, HD / 2)
x2 = slice(qh, -1, HD / 2, HD)
r = qh * cos(ang) + concat(-x2, x1, dim = -1) * sin(ang)
y = reshape(permute(r, [0, 2, 1, 3]), [B, T, C])
z = concat(y, tanh(slice(x, T, 0, 1)), sin(slice(y, T, 1, 3)), dim = T)   # [B, 2 T, C]
w = permute(z, [2, 0, 1]) * g                # [C, B, 2 T]
inv = exp(arange(0, HD, 2) / HD * -log(100))          # RoPE's inverse frequencies [HD / 2]
tab = concat(reshape(arange(T), [T, 1]) * inv, reshape(arange(1, 2 * T, 2), [T, 1]) * inv, dim = -1)
rq = qh * cos(tab) + concat(-x2, x1, dim = -1) * sin(tab)    # a table computed from constants
loss = mean(w * w) + mean(cos(ang) * sin(0.5)) + cos(0) * mean(concat(f, dim = 0)) + mean(rq * rq) / 4 + sum(arange(5)) / 100

minimize loss
optimizer sgd(lr = 0.1)
