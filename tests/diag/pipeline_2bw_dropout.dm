# args: --mesh pipeline=2 --microbatches 2 --schedule 2bw
# Dropout masks are keyed by the updates done, which change inside a 2bw step.
dim B = 8
mesh(pipeline = 1)
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
param v : f32[3, 3] = xavier
h = dropout(relu(x @ w), 0.1)
g = tanh(h @ v)
k = tanh(g)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1)
