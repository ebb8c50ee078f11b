dim B = 4
dim T = 8
input x : f32[B, T]
y = softmax(x, C)
