dim B = 4
dim D = 8
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}
input x : f32[B, D]
input y : i32[B]
layer fc = linear[D, D]
loss = cross_entropy(fc(x), y)
minimize loss
optimizer sgd(lr = 0.1)
