input x : f32[4]
output relu(x)
