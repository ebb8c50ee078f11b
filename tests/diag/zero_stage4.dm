# ZeRO has stages 0 to 3: the statement names them
mesh(data = 2)
dim B = 4
input x : f32[B@data, 3]
param w : f32[3, 2] = xavier
loss = mean(x @ w)
minimize loss
optimizer sgd(lr = 0.1)
zero = 4
