# stack.dm: a stack of pre-norm residual MLP blocks, Megatron-split on tensor, for the
# pipeline tests: every block is a layer, so the stages can be balanced; values cross
# the cuts with their shardings (the residual stream whole, the hidden units split).
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
    return x + gelu(layernorm(x, ln_weight, ln_bias) @ up + up_bias) @ down + down_bias
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

h1 = b1(x)
h2 = b2(h1)
h3 = b3(h2)
h4 = b4(h3)
logits = head(h4)
loss = cross_entropy(logits, y)

output logits
minimize loss
optimizer adamw(lr = 1e-3, weight_decay = 1e-2)
