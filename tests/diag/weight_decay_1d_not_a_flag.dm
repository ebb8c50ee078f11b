# weight_decay_1d is a flag: true (the default, every parameter decayed) or false
dim B = 8
input x : f32[B, 4]
input y : i32[B]
param w : f32[4, 3] = xavier
param b : f32[3] = zeros
loss = cross_entropy(x @ w + b, y)
minimize loss
optimizer adamw(lr = 0.01, weight_decay = 0.5, weight_decay_1d = 2)
