# args: --mesh pipeline=2 --microbatches 2 --schedule pipedream
# w's gradient is made on stage 1 (z = h @ w, the loss path), which updates it; `dead` reads
# it first, on stage 0, off the loss path: pipedream sends updates only to later stages.
dim B = 8
dim C = 8
mesh(data = 1, pipeline = 1)
input x : f32[B, C]
param w : f32[C, C] = xavier
param v : f32[C, C] = xavier
dead = x @ w
h = tanh(x @ v)
z = h @ w
loss = mean(z * z)
minimize loss
optimizer sgd(lr = 0.1)
output dead
