# A parameter read off the loss path before the stage that makes its gradient: `dead` (an
# output) reads w on stage 0, the loss reads it on stage 1 (test_off_loss.py).
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
