# The loss is computed from the input alone: no parameter would ever change.
dim B = 4
input x : f32[B, 3]
param w : f32[3, 2] = xavier
y = x @ w
loss = mean(x * x)
output y
minimize loss
optimizer adamw(lr = 1e-3)
