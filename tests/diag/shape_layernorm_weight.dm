dim B = 4
dim C = 8
input x : f32[B, C]
param w : f32[B] = ones
param b : f32[C] = zeros
y = layernorm(x, w, b)
