dim T = 3
input x : f32[2, T, 4]
input y : f32[2, 5, 3]
a = concat(x, x)
b = concat(x, y, dim = T)
c = concat(x, x, axis = 1)
d = concat(x, 2, dim = 0)
e = permute(x, [0, 1])
f = permute(x, [2, T, -1])
g = permute(x, 0)
h = concat(x, y, dim = -1) + permute(x, [T, 0, 2])
