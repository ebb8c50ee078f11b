# a typed let inside a block is checked when a layer calls the block (it was ignored there)
dim B = 8
dim D = 4
dim H = 16

block mlp[IN, HID](x) {
    param up : f32[IN, HID] = xavier
    param down : f32[HID, IN] = xavier
    h : f32[B, IN] = relu(x @ up)
    return h @ down
}

input x : f32[B, D]
input y : i32[B]
layer m = mlp[D, H]
loss = cross_entropy(m(x), y)
minimize loss
optimizer sgd(lr = 0.1)
