# unreached.dm: parameters the loss does not depend on (a spare vector, a layer declared
# and never called, a branch computed but not in the loss) trained by AdamW with weight
# decay. dmc warns about each; like torch.optim.AdamW, which skips a parameter whose
# .grad is None, it neither updates nor decays them (tests/ref/test_ops.py).
dim B = 4
dim D = 3
dim K = 2

block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = normal(0, 1)
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}

input x : f32[B, D]
param spare : f32[K] = ones
layer fc = linear[D, K]
layer unused = linear[D, K]
param side : f32[D] = ones

h = fc(x)
branch = x * side
loss = mean(tanh(h) * tanh(h))

output branch
minimize loss
optimizer adamw(lr = 0.1, weight_decay = 0.1)
