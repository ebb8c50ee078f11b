# With micro-batches, outputs are the step's rows: one that does not lead with the
# batch is refused at --check rather than at -o.
dim B = 8
accumulate = 2
input x : f32[B, 3]
param w : f32[3, 2] = xavier
h = x @ w
total = sum(h, B)
loss = mean(h * h)
output total
minimize loss
optimizer sgd(lr = 0.1)
