# dropout.dm: stack.dm with dropout on the hidden units (split over tensor) and on each
# block's output and the input (split over data): the masks are drawn by each element's
# index in the whole tensor, so every mesh and micro-batch count trains as the serial
# program (tests/spmd/test_equivalence.py, tests/ref/test_dropout.py).
dim B = 16      # batch
dim D = 32      # width
dim H = 64      # hidden units of each block
dim K = 8       # classes

mesh(data = 1, tensor = 1, pipeline = 1)

block mlp_block[D, H](x) {
    param ln_weight : f32[D] = ones
    param ln_bias   : f32[D] = zeros
    param up        : f32[D, H@tensor] = xavier
    param up_bias   : f32[H@tensor] = zeros
    param down      : f32[H@tensor, D] = xavier
    param down_bias : f32[D] = zeros
    h = dropout(gelu(layernorm(x, ln_weight, ln_bias) @ up + up_bias), 0.25)
    return x + dropout(h @ down + down_bias, 0.1)
}

block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias   : f32[OUT] = zeros
    return x @ weight + bias
}

input x : f32[B@data, D]
input y : i32[B@data]

layer b1 = mlp_block[D, H]
layer b2 = mlp_block[D, H]
layer b3 = mlp_block[D, H]
layer b4 = mlp_block[D, H]
layer head = linear[D, K]

h1 = b1(dropout(x, 0.5))
h2 = b2(h1)
h3 = b3(h2)
h4 = b4(h3)
logits = head(h4)
loss = cross_entropy(logits, y)

output logits
minimize loss
optimizer adamw(lr = 1e-3, weight_decay = 1e-2)
