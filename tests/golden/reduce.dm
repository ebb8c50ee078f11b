# reduce.dm: sum and mean over named dims, by index, and over everything.
dim B = 2
dim T = 3
dim C = 4

input x : f32[B, T, C]
param w : f32[C] = uniform(-1, 1)

h = tanh(x * w)
s = sum(h, T)                 # [B, C]
m = mean(h, B, -1)            # [T]
e = exp(s) + sigmoid(mean(s))
loss = mean(e) + sum(m) / T

output s, m
minimize loss
optimizer adamw(lr = 0.01, weight_decay = 0)
