param w : f32[3] = normal(0)
