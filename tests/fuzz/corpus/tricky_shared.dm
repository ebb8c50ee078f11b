# one layer called twice, a value used many times, a parameter used directly
dim B = 4
dim D = 3
block lin[D](x) {
    param w : f32[D, D] = xavier
    h = x @ w
    return h * h - h / (h + 1)
}
input x : f32[B, D]
input y : i32[B]
param s : f32[D] = ones
layer l = lin[D]
a = l(l(x * s))
b = a + a * s + s
loss = cross_entropy(b, y) + sum(s * s) + mean(l.w)
minimize loss
optimizer adamw(lr = 1e-3, beta1 = 0.5, beta2 = 0.9, eps = 1e-6, weight_decay = 0)
