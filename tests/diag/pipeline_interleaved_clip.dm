# args: --mesh pipeline=2 --microbatches 2 --schedule interleaved --chunks 2 --precision fp16
# Clipping under fp16's loss scaling: a rank's chunks sum their gradients' squares before the
# step's skip is decided, of the scaled gradients (clipping alone is built: spmd-interleaved-clip).
dim B = 8
mesh(pipeline = 1)
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
param v : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h @ v)
k = tanh(g)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1, clip = 1.0)
