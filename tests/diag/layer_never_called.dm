# exit: 0
# A layer declared and never called computes nothing: its block's lets and return depend
# on the arguments' types and are never checked (here a call of an unknown function). A
# warning at the declaration, once per statement: the inner layer of a block two layers
# use once; a layer read only by a path (wte.weight) is used.
dim B = 8
dim D = 4
block bad[C](x) {
    param w : f32[C, C] = xavier
    return nonsense(x @ w)
}
block outer[C](x) {
    param w : f32[C, C] = xavier
    layer spare = bad[C]
    return x @ w
}
block table[C]() {
    param weight : f32[C, C] = xavier
    return weight
}
input x : f32[B, D]
input y : i32[B]
layer unused = bad[D]
layer h = repeat 2 outer[D]
layer tied = table[D]
loss = cross_entropy(h(x) @ tied.weight, y)
minimize loss
optimizer sgd(lr = 0.1)
