# args: --microbatches 2
# a table fed as an input that does not lead with the batch: micro-batches cannot split it
dim B = 4
dim T = 8
input tokens : f32[B, T]
input table : f32[T, 2]
param w : f32[2] = ones
loss = mean(tokens * sum(table * w, -1))
minimize loss
optimizer sgd(lr = 0.1)
