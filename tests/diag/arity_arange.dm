dim T = 4
input x : f32[T]
a = arange(0)
b = arange(1, T, 0)
c = arange(x)
d = arange(0, T, 1, 2)
e = x * arange(T) + arange(-3, 5, 2) * arange(2, 0.5, -0.5)
