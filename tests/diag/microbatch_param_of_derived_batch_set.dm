# exit: 0
# args: --accumulate 2 --set B2=8
# a dim computed from the batch but set on the command line is the parameter's own
dim B = 4
dim B2 = B * 2
dim D = 3
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
param e : f32[B2, D] = zeros
logits = x @ w + mean(e, 0)
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
