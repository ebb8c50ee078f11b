dim B = 4
input x : f32[B, 3]
h = relu(x)
minimize h
