# args: --quantize int8-weights --prune 0.5
# exit: 2
# --prune with --quantize: a quantized program never trains, so nothing would be pruned.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
