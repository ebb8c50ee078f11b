# broadcast.dm: numpy broadcasting in forward and sum_to in backward.
dim B = 4
dim H = 3

input x : f32[B, H]
input y : i32[B]
param bias : f32[H] = zeros             # [H] against [B, H]: rank grows
param scale : f32[1, H] = ones          # [1, H] against [B, H]: a size-1 dim
param shift : f32[B, 1] = normal(0, 0.1)
param gain : f32[] = ones               # a scalar parameter

a = x + bias
b = a * scale
c = b - shift
d = c / 2 + gain * c
loss = cross_entropy(d, y)

output d
minimize loss
optimizer sgd(lr = 0.1)
