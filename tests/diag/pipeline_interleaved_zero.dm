# args: --mesh data=2,pipeline=2 --microbatches 4 --schedule interleaved --chunks 2
# ZeRO's shares are laid out per rank region, which interleaved ranks split between chunks.
dim B = 8
mesh(data = 1, pipeline = 1)
zero = 1
input x : f32[B@data, 3]
input y : i32[B@data]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
loss = cross_entropy(g, y)
minimize loss
optimizer sgd(lr = 0.1)
