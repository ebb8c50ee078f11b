# exit: 0
# Warnings are capped as errors are: the first 20 are printed, then one line counts the
# rest (a program of 65536 layer instances can make one per parameter).
dim B = 4
dim D = 4
block unused[C](x) {
    param a : f32[C] = zeros
    return x * a
}
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
layer h = repeat 30 unused[D]
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
