# args: --mesh data=2 --compress topk:0.01
# gradient compression replaces the allreduces that ZeRO turns into reduce-scatters
mesh(data = 1)
zero = 1
input x : f32[4@data, 3]
param w : f32[3, 2] = xavier
loss = sum(x @ w)
minimize loss
optimizer adamw(lr = 1e-3)
