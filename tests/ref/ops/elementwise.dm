# elementwise.dm: every unary function, unary minus, and + - * / with numeric and dim
# constants on either side (tests/ref/test_ops.py).
dim B = 4
dim H = 6

input x : f32[B, H]
param a : f32[B, H] = normal(0, 1)
param b : f32[B, H] = normal(0, 1)
param c : f32[B, H] = normal(0, 1)

u = x * a + b
g1 = gelu(u)
t1 = tanh(0.5 * u)
s1 = sigmoid(u - 1)
e1 = exp(u / 4)
l1 = log(sigmoid(c) + 0.5)       # log of a positive value
l2 = log(exp(c * 0.3))           # exp then log
r1 = relu(u)
i1 = identity(c)
n1 = neg(c)
m1 = -u
k1 = 2 / (1 + e1)                # constant numerator: gradient of the denominator
w1 = silu(u)
q1 = rsqrt(c * c + 0.5)          # of a positive value
z = g1 * c + t1 * 2 - s1 / H + e1 * l1 + r1 * i1 - n1 * m1 + H * l2 + (3 - u) / B - B + w1 * q1
loss = mean(z * z) / 10 + sum(k1) / (B * H) + mean(silu(c) * rsqrt(4)) + rsqrt(sum(w1 * w1) + 1)

minimize loss
optimizer sgd(lr = 0.1)
