# args: --mesh pipeline=4 --microbatches 2
# 2bw needs M >= P: a step would owe backwards of two batches (a third weight version).
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
schedule pipedream_2bw(microbatches = 2)
optimizer sgd(lr = 0.1)
