input x : f32[4, 3]
param v : f32[3] = ones
y = x @ v
