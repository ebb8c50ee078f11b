# args: --compact pruned.safetensors --save-compacted c.safetensors
# exit: 2
# --save-compacted with --check, which writes no files: refused, not ignored (the file
# is not opened: the options are refused first).
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
