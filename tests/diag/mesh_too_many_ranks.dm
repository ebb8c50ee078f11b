# Each axis is at most 65536, and so is their product held, to 2^20 ranks: four axes of
# 65536 would otherwise multiply to 2^64, a mesh of "0 ranks" run serially.
mesh(data = 65536, tensor = 65536, a = 65536, b = 65536)
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
