# Arguments that cannot mean what they say: a dim reduced or swapped with itself (a slip
# for another dim), a number for the flag nesterov, a flag for a number.
dim B = 8
dim T = 4
input x : f32[B, T]
input y : i32[B]
param w : f32[T, T] = xavier
a = sum(x, T, T)
b = mean(x, 0, -2)
c = transpose(x, T, T)
d = transpose(x, 0, -2)
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = true, nesterov = 3, momentum = false)
