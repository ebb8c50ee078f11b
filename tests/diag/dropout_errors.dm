# dropout's probability is a constant in [0, 1), and it takes an f32 tensor
dim B = 4
input x : f32[B, 8]
input y : i32[B]
param w : f32[8, 3] = xavier
a = dropout(x, 1)
b = dropout(y, 0.5)
c = dropout(x, -0.1)
loss = cross_entropy(dropout(x, 0.2) @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
