# args: --set H=100000000
# --set makes a block's weight too large: the error names the parameter (its layer's
# path), its shape with the dims' values, and the layer declaration that sized it; the
# layer's uses do not cascade into "unknown name".
dim B = 4
dim D = 8
dim H = 16
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}
input x : f32[B, D]
input y : i32[B]
layer fc1 = linear[D, H]
layer fc2 = linear[H, H]
layer fc3 = linear[H, D]
loss = cross_entropy(fc3(relu(fc2(relu(fc1(x))))), y)
minimize loss
optimizer adamw(lr = 1e-3)
