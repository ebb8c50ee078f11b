# keepdim.dm: reductions that keep their dims (keepdim = true) broadcast back against
# their operand: RMSNorm in a block that knows only C (LLaMA's, as torch writes it),
# the last, a middle, two non-adjacent and all dims kept, by name and by index
# (tests/ref/test_ops.py).
dim B = 3
dim T = 4
dim C = 6

block rmsnorm[C](x) {
    param weight : f32[C] = ones
    return x * rsqrt(mean(x * x, -1, keepdim = true) + 1e-5) * weight
}

input x : f32[B, T, C]
param v : f32[C, C] = normal(0, 0.5)
layer norm = rmsnorm[C]

h = x @ v
n = norm(h)                              # [B, T, C]
s_t = sum(h, T, keepdim = true)          # [B, 1, C]
m_bc = mean(h, 0, C, keepdim = true)     # [1, T, 1]
s_all = sum(h * h, keepdim = true)       # [1, 1, 1]
m_flat = mean(h, -1, keepdim = false)    # [B, T], as mean(h, -1)
z = n * silu(n) + s_t * m_bc / s_all + tanh(h - mean(h, C, keepdim = true))
loss = mean(z * z) + mean(m_flat * m_flat)

minimize loss
optimizer sgd(lr = 0.1)
