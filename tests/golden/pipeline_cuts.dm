# pipeline_cuts.dm: cuts given by the program (schedule ... cuts = [...]), a stack of
# four residual blocks on 3 stages, 1F1B with 6 micro-batches.
dim B = 24
dim D = 32

mesh(pipeline = 3)
schedule 1f1b(microbatches = 6, cuts = [h1, h3])

block residual[D](x) {
    param weight : f32[D, D] = xavier
    param bias   : f32[D] = zeros
    return x + tanh(x @ weight + bias)
}

input x : f32[B, D]
input y : i32[B]

layer b1 = residual[D]
layer b2 = residual[D]
layer b3 = residual[D]
layer b4 = residual[D]

h1 = b1(x)
h2 = b2(h1)
h3 = b3(h2)
h4 = b4(h3)
loss = cross_entropy(h4, y)

minimize loss
optimizer sgd(lr = 0.1)
