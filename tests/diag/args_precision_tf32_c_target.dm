# args: --precision tf32
# exit: 2
# --precision tf32 on the C target: --check refuses it as -o and dmc run do.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
