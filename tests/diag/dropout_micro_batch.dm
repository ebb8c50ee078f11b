# args: --accumulate 2
# with micro-batches, a dropped value must lead with the batch (its rows are numbered
# across the step's batch)
dim B = 4
input x : f32[B, 8]
input y : i32[B]
param w : f32[8, 3] = xavier
loss = cross_entropy(x @ dropout(w, 0.5), y)
minimize loss
optimizer sgd(lr = 0.1)
