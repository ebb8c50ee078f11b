# layers.dm: a parameter used twice (gradients accumulate), a layer called twice (shared
# parameters), a repeat layer of nested blocks, a block reading a top-level parameter,
# rank-3 matmuls (tests/ref/test_ops.py).
dim B = 2
dim T = 3
dim D = 4

block lin[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}

block mlp[C](x) {
    layer fc = lin[C, 2 * C]
    layer proj = lin[2 * C, C]
    return x + proj(gelu(fc(x))) * gate   # gate: a top-level parameter
}

input x : f32[B, T, D]
param w : f32[D, D] = normal(0, 0.5)
param gate : f32[D] = ones
layer shared = lin[D, D]
layer stack = repeat 3 mlp[D]

h1 = shared(x)
h2 = shared(tanh(h1))                 # the same layer again
h3 = h2 @ w + tanh(h1 @ w) * sum(w, 0)  # w used three times (two matmuls, a reduction)
h4 = stack(h3)
loss = mean(h4 * h4) + mean(w * w)

minimize loss
optimizer sgd(lr = 0.1)
