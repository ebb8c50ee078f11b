# reduce.dm: sum and mean of a rank-3 tensor over everything, one named dim, an index,
# two dims (adjacent and not), and their gradients (broadcasts) (tests/ref/test_ops.py).
dim B = 3
dim T = 4
dim C = 5

input x : f32[B, T, C]
param w : f32[T, C] = normal(0, 1)
param v : f32[C] = normal(0, 1)

h = tanh(x * w + v)            # [B, T, C]
s_all = sum(h)                 # scalar
m_all = mean(h * h)            # scalar
s_c = sum(h, C)                # [B, T]
m_t = mean(h, T)               # [B, C]
s_last = sum(exp(h), -1)       # [B, T]
s_bt = sum(h, B, T)            # [C]
m_bc = mean(h * x, B, C)       # [T], non-adjacent dims
m_0 = mean(h, 0)               # [T, C]
s_m2 = sum(h, -2)              # [B, C]
loss = s_all / 10 + m_all + mean(s_c * s_last) / 10 + mean(m_t * m_t) + sum(s_bt * v) / 10 + sum(tanh(m_bc)) + mean(m_0 * w) + mean(s_m2 * m_t)

minimize loss
optimizer sgd(lr = 0.1)
