# rope.dm: LLaMA's rotary embedding for the equivalence tests (tests/spmd): heads split
# over tensor moved by permute (the split goes with its dim), cos and sin of an angle
# table made by concat, rotate_half as concat(-x2, x1, dim = -1) along a whole dim of a
# tensor split on others (batch over data, heads over tensor), then a concat along a dim
# split over tensor (the rule gathers it first) and a general permute back; a RoPE table
# computed from arange (replicated, read by split heads); a concat of a row-parallel
# row-parallel products' pending sums.

dim B = 16
dim D = 32
dim H = 64
dim K = 8
dim T = 2
dim NH = 4
dim HD = 4

mesh(data = 1, tensor = 1)

input x : f32[B@data, D]
input y : i32[B@data]

param embed : f32[D, D] = xavier
param f : f32[T, HD / 2] = normal(0, 1)
param head : f32[H, K] = xavier
param mix : f32[H@tensor, D] = xavier
param mix2 : f32[H@tensor, D] = xavier

h = reshape(x @ embed, [B, T, NH, HD])
q : f32[B@data, T, NH@tensor, HD] = h        # heads split over tensor
qh = permute(q, [B, NH, T, HD])              # [B, NH, T, HD]: the split moves with NH
ang = concat(f, f, dim = -1)                 # [T, HD]
x1 = slice(qh, -1, 0, HD / 2)
x2 = slice(qh, -1, HD / 2, HD)
inv = exp(arange(0, HD, 2) / HD * -log(10000))
tab = reshape(arange(T), [T, 1]) * concat(inv, inv, dim = -1)    # RoPE's table, from constants
r = qh * cos(ang) * cos(tab) + concat(-x2, x1, dim = -1) * sin(ang + tab)
s : f32[B@data, NH, T, HD@tensor] = r        # the rotated width split over tensor
z = concat(s, tanh(s), dim = HD)             # joined along a split dim: gathered first
back = permute(z, [0, 2, 1, -1])             # [B, T, NH, 2 HD]
flat = reshape(back, [B, H])
p1 = flat @ mix                              # row-parallel: a sum pending over tensor
p2 = flat @ mix2
logits = (flat + concat(p1, p2, dim = -1)) @ head   # pending sums joined
loss = cross_entropy(logits, y)

minimize loss
optimizer sgd(lr = 0.1)
