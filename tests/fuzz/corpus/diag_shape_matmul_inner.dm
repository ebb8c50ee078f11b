dim B = 4
dim D = 3
dim H = 5
input x : f32[B, D]
param w : f32[H, D] = xavier
y = x @ w
