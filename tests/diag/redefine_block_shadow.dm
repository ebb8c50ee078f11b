# A block's inputs and lets are bound per call, its dim parameters, dims, params and
# layers per layer: a name in both is a redefinition, not a let that silently hides the
# parameter (the model would compute h @ relu(h)). Reported once per block, at the later
# of the two, and the uses of the name do not cascade.
dim B = 8
dim N = 4
input x : f32[B, N]
input y : i32[B]
block lin[N](h) {
    param w : f32[N, N] = xavier
    w = relu(h)
    return h @ w
}
block takes_param[M](x) {
    param x : f32[M, M] = xavier
    return x
}
block takes_dim[N](N) {
    return N
}
block hides_layer[K](h) {
    layer inner = lin[K]
    inner = h
    return inner(h)
}
layer l = lin[N]
layer m = hides_layer[N]
logits = m(l(x))
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
