param w : f32[3] = zeros(1)
