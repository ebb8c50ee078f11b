# args: --set B=99999999999999999999
# exit: 2
# A --set value past 64 bits: refused naming it (strtoll clamped it to INT64_MAX).
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
