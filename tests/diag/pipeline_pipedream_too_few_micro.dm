# args: --mesh pipeline=4 --microbatches 3
# pipedream needs M >= P: the backwards a step owes must all be of its own batch.
dim B = 12
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
schedule pipedream(microbatches = 3)
optimizer sgd(lr = 0.1)
