# args: --name My-Net
# exit: 2
# A --name that is not a C identifier is refused, not rewritten (it was my_net, whose
# symbols the user would not find).
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
