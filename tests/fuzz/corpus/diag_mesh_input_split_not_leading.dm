# An input split on a dim other than its leading one: generated code reads a rank's
# block of an input only when it is contiguous (the batch's rows), so --check refuses it
# rather than -o.
mesh(data = 1, tensor = 2)
dim B = 4
dim D = 8
input x : f32[B, D@tensor]
param w : f32[D, 2] = xavier
loss = mean(x @ w)
minimize loss
optimizer sgd(lr = 0.1)
