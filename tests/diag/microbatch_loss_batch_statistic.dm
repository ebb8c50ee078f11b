# a batch statistic (each row centred by the batch's mean): each micro-batch would see
# only its own rows
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
h = x @ w
centred = h - mean(h, 0)
loss = cross_entropy(centred, y)
minimize loss
optimizer sgd(lr = 0.1)
accumulate = 2
