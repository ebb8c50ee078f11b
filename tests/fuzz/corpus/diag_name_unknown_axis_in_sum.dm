dim B = 4
dim H = 3
input x : f32[B, H]
s = sum(x, T)
