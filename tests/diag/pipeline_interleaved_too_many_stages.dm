# args: --mesh pipeline=32 --chunks 3 --microbatches 32 --schedule interleaved
# Stage sets are 64-bit masks in the generated code: 32 ranks x 3 chunks are 96 stages.
dim B = 32
dim L = 120
mesh(pipeline = 2)
block f(x) {
    param w : f32[3, 3] = xavier
    return relu(x @ w)
}
input x : f32[B, 3]
layer h = repeat L f
loss = mean(h(x))
minimize loss
optimizer sgd(lr = 0.1)
