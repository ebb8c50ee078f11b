# A definition that fails (a dim, an input, a parameter, a layer) still defines its
# name: each error is reported once, not again as "unknown" at every use.
dim A = 5 / 2
dim N = 1048576
input x : f32[A, 3]
input z : f32[N, N, N]
param w : f32[N, N, N] = zeros
layer l = nosuch[3]
y = x + z + w
q = l(y)
r = l.weight
minimize q
optimizer sgd(lr = 0.1)
