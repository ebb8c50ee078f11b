# args: --set C=10
# A dim error in a repeated layer's block is reported once (for its first member), with
# the layer that sized it, not once per member.
dim B = 2
dim C = 8
dim NH = 4
block head[C, NH](x) {
    dim HS = C / NH
    param w : f32[C, HS] = xavier
    return x @ w
}
input x : f32[B, C]
layer h = repeat 3 head[C, NH]
loss = mean(h(x))
minimize loss
optimizer sgd(lr = 0.1)
