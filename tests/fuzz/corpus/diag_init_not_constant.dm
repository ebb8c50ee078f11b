param w : f32[3] = uniform(0, hi)
