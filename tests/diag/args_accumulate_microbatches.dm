# args: --accumulate 4 --microbatches 2
# exit: 2
# Two counts of micro-batches on the command line: refused, as in a .dm file.
dim B = 8
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
loss = cross_entropy(h, y)
minimize loss
optimizer sgd(lr = 0.1)
