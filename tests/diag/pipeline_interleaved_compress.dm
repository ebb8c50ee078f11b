# args: --mesh data=2,pipeline=2 --microbatches 2 --schedule interleaved --chunks 2 --compress powersgd:2 --precision fp16
# PowerSGD's check under fp16 would be each chunk's, where the loss scaler decides once a rank.
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
optimizer sgd(lr = 0.1)
