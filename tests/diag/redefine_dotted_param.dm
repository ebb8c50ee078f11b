# A dotted name is a path into a layer: defining one would shadow what the layer defines,
# or give two parameters one name (`--save` would then fail, after training). It is a
# redefinition where the path names something already, else an error of its own; in a
# block too, once.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
}
block nested(x) {
    param inner.weight : f32[4, 4] = xavier
    return x @ inner.weight
}
layer fc1 = linear[D, D]
param fc1.weight : f32[D, D] = xavier
param fc2.weight : f32[D, D] = xavier
layer fc2 = linear[D, D]
layer fc3 = nested
logits = fc3(fc2(fc1(x))) @ fc2.weight
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
