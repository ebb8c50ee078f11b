# args: -o args_check_with_output.out
# exit: 2
# -o beside --check: refused, not ignored (--check writes no code).
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
