# repeat.dm: a repeated residual block, nested layers and sgd with momentum.
dim B = 4
dim D = 6
dim K = 3
dim L = 3

block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}

block residual[C](x) {
    layer fc = linear[C, C]
    h = relu(fc(x))
    return x + h
}

input x : f32[B, D]
input y : i32[B]
layer h = repeat L residual[D]
layer head = linear[D, K]

logits = head(h(x))
loss = cross_entropy(logits, y)
w0 = h.0.fc.weight

output logits
minimize loss
optimizer sgd(lr = 0.1, momentum = 0.9, dampening = 0.1, weight_decay = 1e-4)
