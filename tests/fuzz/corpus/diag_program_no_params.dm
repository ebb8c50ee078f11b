# A loss and an optimizer, but no parameter to train.
dim B = 4
input x : f32[B, 3]
loss = mean(x * x)
minimize loss
optimizer adamw(lr = 1e-3)
