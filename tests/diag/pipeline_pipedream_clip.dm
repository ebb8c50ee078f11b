# args: --mesh pipeline=2 --microbatches 2 --schedule pipedream
# Clipping's global norm spans the stages, which finish a micro-batch's gradients at different points.
dim B = 8
mesh(data = 1, pipeline = 1)
input x : f32[B@data, 3]
input y : i32[B@data]
param w : f32[3, 3] = xavier
param v : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h @ v)
k = tanh(g)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1, clip = 1.0)
