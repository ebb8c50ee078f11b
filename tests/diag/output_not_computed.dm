# With micro-batches (or pipeline stages) an output is written by the op that computes it,
# each micro-batch's rows copied into the step's: an input, a parameter or a reshape of one
# is refused at --check as at -o, at the output statement (not at the input's declaration).
dim B = 8
dim D = 4
accumulate = 2
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
flat = reshape(x, [B, D])
loss = cross_entropy(logits, y)
output logits, x
output flat
minimize loss
optimizer sgd(lr = 0.1)
