# exit: 0
# args: --set B=16,M=4
# Mesh sizes, a schedule's microbatches and chunks and accumulate may use the dims written
# before them, with their --set values (B is the whole batch here: the program's B is one
# micro-batch of it). Nothing to report.
dim B = 8
dim N = 2
dim M = 2
dim V = N
mesh(data = N, pipeline = N / 2)
schedule interleaved(microbatches = M * 1, chunks = V)
accumulate = M
input x : f32[B@data, 4]
input y : i32[B]
param w : f32[4, 4] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
