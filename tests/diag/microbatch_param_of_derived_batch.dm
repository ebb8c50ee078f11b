# args: --accumulate 2
# a parameter shaped by a dim computed from the batch (top level, and a block's dim given
# an expression of the batch) would be made at a micro-batch's size too
dim B = 4
dim B2 = B * 2
dim D = 3
input x : f32[B, D]
input y : i32[B]
block shift[N, C](h) {
    param offset : f32[N + 1, C] = zeros
    return h + mean(offset, 0)
}
param w : f32[D, D] = xavier
param e : f32[B2, D] = zeros
layer s = shift[B, D]
logits = s(x @ w) + mean(e, 0)
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
