dim B = 4
input ids : i32[B, 3]
param w : f32[3, 5] = xavier
y = ids @ w
