# mlp.dm: a three-layer perceptron for Fashion-MNIST (28x28 images, 10 classes).
#   dmc run examples/mlp.dm --epochs 5

dim B = 128     # batch
dim D = 784     # pixels
dim H = 1024    # hidden width
dim K = 10      # classes

# One device by default. `--mesh data=N` splits every batch over N ranks (data
# parallel); `--mesh tensor=N` splits fc1 by columns and fc2 by rows over N ranks
# (Megatron-LM's MLP: one allreduce forward, one backward); `--mesh pipeline=N` cuts the
# layers into N stages that micro-batches flow through (--microbatches, --schedule); all
# three compose.
mesh(data = 1, tensor = 1, pipeline = 1)

# x @ weight + bias, with weight stored [in, out]
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias   : f32[OUT] = zeros
    return x @ weight + bias
}

# the same, each rank holding a block of the output columns: no communication
block column_linear[IN, OUT](x) {
    param weight : f32[IN, OUT@tensor] = xavier
    param bias   : f32[OUT@tensor] = zeros
    return x @ weight + bias
}

# the same, each rank holding a block of the input rows: a pending sum, allreduced
block row_linear[IN, OUT](x) {
    param weight : f32[IN@tensor, OUT] = xavier
    param bias   : f32[OUT] = zeros
    return x @ weight + bias
}

input x : f32[B@data, D]
input y : i32[B@data]

layer fc1 = column_linear[D, H]
layer fc2 = row_linear[H, H]
layer fc3 = linear[H, K]

xn = (x - 0.2860) / 0.3530   # standardise pixels (Fashion-MNIST mean and std)
h1 = relu(fc1(xn))
h2 = relu(fc2(h1))
logits = fc3(h2)
loss = cross_entropy(logits, y)

output logits
minimize loss
optimizer adamw(lr = 1e-3, weight_decay = 1e-4)
