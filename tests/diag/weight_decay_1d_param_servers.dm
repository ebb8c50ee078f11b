# args: --param-servers 1
# the servers run one update function over every shard: decay by parameter is not built
dim B = 8
mesh(data = 2)
input x : f32[B@data, 4]
input y : i32[B@data]
param w : f32[4, 3] = xavier
param b : f32[3] = zeros
loss = cross_entropy(x @ w + b, y)
minimize loss
optimizer adamw(lr = 0.01, weight_decay = 0.5, weight_decay_1d = false)
