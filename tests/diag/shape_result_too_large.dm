# A result whose sizes each pass the limit can exceed it together: a broadcast, a product
# and an expand are held to 2^40 elements as declared types are (past it, or past int64), each
# at its expression.
dim B = 8
dim D = 4
dim M = 4294967296
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
param a : f32[M, 1] = ones
param b : f32[1, M] = ones
param c : f32[1048576, 1] = ones
outer = a * b
wide = c * b
product = a @ b
z = expand(reshape(x @ w, [1, B, D]), [2305843009213693952, B, D])
logits = sum(z, 0)
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
