mesh(data = 2, tensor = 2)
dim B = 8
dim D = 4
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT@tensor] = normal(0, 0.02)
    param bias : f32[OUT@tensor] = uniform(-0.1, 0.1)
    return x @ weight + bias
}
input x : f32[B@data, D]
input y : i32[B@data]
layer fc = linear[D, 2 * D]
h : f32[B@data, 8] = gelu(fc(x))
p = mean(sigmoid(h), -1) + sum(exp(neg(h)), 1) / D
q = reshape(transpose(reshape(h, [B, 2, D]), 1, 2), [B, -1])
loss = cross_entropy(q, y) + mean(log(p + 1)) - identity(mean(p))
output q, p
minimize loss
optimizer sgd(lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 1e-4)
