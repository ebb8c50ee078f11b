# args: --memory-gb 0.00001
dim B = 8
mesh(pipeline = 2)
input x : f32[B, 256]
input y : i32[B]
param w1 : f32[256, 256] = xavier
param w2 : f32[256, 16] = xavier
h = relu(x @ w1)
loss = cross_entropy(h @ w2, y)
minimize loss
optimizer sgd(lr = 0.1)
