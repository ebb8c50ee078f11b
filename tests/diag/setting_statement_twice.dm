# A second precision, zero or accumulate statement would silently replace the first (as a
# second mesh or optimizer would, which are errors too): each is an error at the second,
# with a note at the first.
dim B = 8
dim D = 4
precision bf16
accumulate = 2
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
zero = 1
precision fp32
accumulate = 2
zero = 0
