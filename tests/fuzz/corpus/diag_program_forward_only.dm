# A forward computation with neither a loss nor an optimizer.
dim B = 4
input x : f32[B, 3]
param w : f32[3, 2] = xavier
y = x @ w
output y
