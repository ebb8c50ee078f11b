# a nonlinear function of a batch mean: the mean of the micro-batches' values is not
# the whole batch's
dim B = 8
dim D = 4
input x : f32[B, D]
param w : f32[D, D] = xavier
logits = x @ w
loss = exp(mean(logits))
minimize loss
optimizer sgd(lr = 0.1)
accumulate = 2
