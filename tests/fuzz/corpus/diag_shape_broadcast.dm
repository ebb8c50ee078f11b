dim B = 4
dim H = 3
input x : f32[B, H]
param b : f32[B] = zeros
y = x + b
