# args: --mesh pipeline=2
# A parameter used on both stages (tied): its new values would reach the other stage at the
# owner's update, which pipedream runs at another point of each stage's step.
dim B = 8
mesh(pipeline = 1)
schedule pipedream(microbatches = 2, cuts = [h])
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
g = tanh(h)
k = tanh(g @ w)
loss = cross_entropy(k, y)
minimize loss
optimizer sgd(lr = 0.1)
