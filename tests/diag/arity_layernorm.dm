dim C = 8
input x : f32[2, C]
param w : f32[C] = ones
param b : f32[C] = zeros
y = layernorm(x, w, b, epsilon = 1e-5)
z = layernorm(x, w, b, eps = 0)
u = layernorm(x, w)
