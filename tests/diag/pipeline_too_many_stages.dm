# args: --mesh pipeline=65
# Stage sets are 64-bit masks in the generated code.
dim B = 8
dim L = 80
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
