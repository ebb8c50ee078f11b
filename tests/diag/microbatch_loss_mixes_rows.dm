# a matrix product over the batch dim combines rows: each micro-batch would see only its own
dim B = 8
dim D = 4
input x : f32[B, D]
param w : f32[D, D] = xavier
gram = transpose(x) @ (x @ w)
loss = mean(gram * gram)
minimize loss
optimizer sgd(lr = 0.1)
mesh(pipeline = 2)
schedule gpipe(microbatches = 2)
