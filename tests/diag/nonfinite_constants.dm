# A constant is an f32 in the generated code: one that is, or folds to, inf or NaN (past
# f32's range) is refused where it is made, with what it folded from.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = normal(0, 1e39)
a = x * 1e39
b = x + 0.0 / 0.0
c = x * exp(1000)
d = x + log(0)
e = x * (1e20 * 1e20)
g = x * sqrt(0 - 1)
f = layernorm(x, w, w, eps = 1e39)
loss = cross_entropy(x @ w, y)
minimize loss
optimizer adamw(lr = 1e39, eps = 1 / 0)
