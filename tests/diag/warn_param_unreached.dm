# exit: 0
# A parameter the loss does not reach compiles, with a warning, and is never updated
# (nor decayed: torch.optim skips a parameter whose .grad is None).
dim B = 4
input x : f32[B, 3]
param w : f32[3, 2] = xavier
param spare : f32[2] = zeros
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
}
layer unused = linear[3, 2]
loss = mean(x @ w)
minimize loss
optimizer adamw(lr = 1e-3, weight_decay = 0.1)
