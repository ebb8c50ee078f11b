input x : f32[4, 3]
a = mean(x, -1, keep = true)
b = sum(x, 0, keepdim = 2)
c = mean(x, keepdim = true, 1)
d = sum(x, keepdim = true) + mean(x, 1, keepdim = false)
