# A model and an optimizer, but no `minimize`: there is nothing to optimize.
dim B = 4
input x : f32[B, 3]
param w : f32[3, 2] = xavier
y = x @ w
output y
optimizer sgd(lr = 0.1)
