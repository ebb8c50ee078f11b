dim C = 8
input x : f32[2, C]
a = slice(x, -1, 4, 12)
b = slice(x, 1, 5, 5)
c = slice(x, 0, 0)
