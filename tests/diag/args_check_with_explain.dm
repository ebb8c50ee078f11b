# args: --explain
# exit: 2
# --check beside --explain: two commands, refused (--explain ran and nothing was checked).
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
