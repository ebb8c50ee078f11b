param w : f32[3] = normal(0, sqrt(-1))
param u : f32[3] = normal(0, exp(1))
