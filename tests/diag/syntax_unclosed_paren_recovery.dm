# A call left open swallows the newline after it: the error shows at the next line's
# first token, with a note at the open bracket, and that line is then parsed as a
# statement of its own, so the errors of the lines after it are reported too.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
h = relu(x @ w
logits = h +* 2
loss = cross_entropy(logits, y))
block f(x) {
    g = tanh(x
}
minimize loss
optimizer sgd(lr = 0.1)
