param w : f32[3] = gaussian
