# layout.dm: reshape (with -1) and transpose, through a block.
dim B = 2
dim T = 3
dim C = 4
dim K = 5

block proj[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
}

input x : f32[B, T, C]
input y : i32[T]
layer p = proj[B * C, K]
param scale : f32[C] = ones

flat = reshape(x * scale, [B * T, C])
back = reshape(gelu(flat), [B, -1, C])
swapped = transpose(back, 0, 1)          # [3, B, C]: -1 leaves the dim unnamed
rows = reshape(swapped, [T, B * C])
logits = p(rows)                         # [T, K]
t = transpose(logits)                    # [K, T]
loss = cross_entropy(transpose(t), y)

output t
minimize loss
optimizer sgd(lr = 0.05)
