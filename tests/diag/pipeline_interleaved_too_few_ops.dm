# 2 ranks x 4 chunks make 8 stages: more than the forward pass has ops.
dim B = 8
mesh(pipeline = 2)
schedule interleaved(microbatches = 2, chunks = 4)
input x : f32[B, 3]
input y : i32[B]
param w : f32[3, 3] = xavier
h = relu(x @ w)
loss = cross_entropy(h, y)
minimize loss
optimizer sgd(lr = 0.1)
