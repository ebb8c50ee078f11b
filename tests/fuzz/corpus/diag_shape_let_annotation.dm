dim B = 4
input x : f32[B, 3]
y : f32[B, 4] = relu(x)
