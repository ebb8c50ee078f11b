# A layer or block named after a built-in function could never be called by its name:
# `relu(x)` always calls the function. Each definition is an error naming the function,
# a layer inside a block once for the block (not once per layer that uses it).
dim B = 8
dim D = 4
block relu[C](x) {
    param w : f32[C, C] = xavier
    return x @ w
}
block linear[C](x) {
    param w : f32[C, C] = xavier
    layer softmax = relu[C]
    return softmax(x @ w)
}
input x : f32[B, D]
input y : i32[B]
layer sum = relu[D]
layer fc1 = linear[D]
layer fc2 = linear[D]
loss = cross_entropy(fc2(fc1(x)), y)
minimize loss
optimizer sgd(lr = 0.1)
