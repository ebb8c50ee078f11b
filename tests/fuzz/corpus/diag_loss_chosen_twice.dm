input x : f32[4]
a = sum(x)
b = mean(x)
minimize a
minimize b
