# args: --accumulate 2
# with micro-batches the step takes the mean of their losses: a loss summed over the
# batch would come out twice too small
dim B = 4
input x : f32[B, 8]
input y : f32[B, 3]
param w : f32[8, 3] = xavier
err = x @ w - y
loss = sum(err * err)
minimize loss
optimizer sgd(lr = 0.1)
