param w : f32[4] = zeros
param w : f32[4] = ones
