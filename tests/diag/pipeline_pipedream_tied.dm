# args: --mesh pipeline=3
# A parameter used on the first and the last of 3 stages (tied): the last stage's copy
# would wait for an update the first makes in the next step.
dim B = 8
mesh(pipeline = 1)
schedule pipedream(microbatches = 4, cuts = [h, g])
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
k = tanh(g @ w)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1)
