# interleaved.dm: interleaved 1F1B from the program: a stack of eight equal residual blocks
# on 2 pipeline ranks with 2 model chunks each (4 stages of two blocks; stage j on rank
# j mod 2), 4 micro-batches. The blocks dominate the head, so the simulated bubble is near
# the formula (P - 1) / (v M + P - 1) = 1/9.
dim B = 64
dim D = 256
dim L = 8

mesh(pipeline = 2)
schedule interleaved(microbatches = 4, chunks = 2)

block residual[D](x) {
    param weight : f32[D, D] = xavier
    param bias   : f32[D] = zeros
    return x + tanh(x @ weight + bias)
}

input x : f32[B, D]
input y : i32[B]

layer h = repeat L residual[D]
loss = cross_entropy(h(x), y)

minimize loss
optimizer sgd(lr = 0.1)
