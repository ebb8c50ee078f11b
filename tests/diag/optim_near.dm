# A misspelt optimizer: the nearest of them.
dim B = 4
input x : f32[B, 3]
param w : f32[3, 2] = xavier
loss = mean(x @ w)
minimize loss
optimizer adam(lr = 1e-3)
