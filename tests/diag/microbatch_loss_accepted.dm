# exit: 0
# args: --accumulate 4
# a mean over the batch's rows, plus a term that reads no batch (a weight penalty) scaled
# and summed: the mean of the micro-batches' losses is the whole batch's
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
input target : f32[B, D]
param w : f32[D, D] = xavier
h = reshape(x @ w, [B * D])
err = reshape(h, [B, D]) - target
loss = cross_entropy(x @ w, y) + 0.5 * mean(err * err) + 0.01 * sum(w * w) / 2.0
minimize loss
optimizer sgd(lr = 0.1)
