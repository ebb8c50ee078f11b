# Every independent error is reported, in source order.
dim B = 4
input x : f32[B, 3]
y = relu(q)
param w : f32[5, 2] = xavier
z = x @ w
u = tanh(x, x)
param k : i32[3] = zeros
optimizer foo(lr = 1)
