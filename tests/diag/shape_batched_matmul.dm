input a : f32[2, 3, 4, 5]
input b : f32[3, 2, 5, 6]
c = a @ b
d = a @ transpose(b)
