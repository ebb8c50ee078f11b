# An initialiser's arguments must be finite (every weight would be NaN or inf), normal's std
# not negative and uniform's lo not above its hi, as torch's normal_ and uniform_ require.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param a : f32[D, D] = normal(0, 1 / 0)
param b : f32[D, D] = normal(0, -1)
param c : f32[D, D] = uniform(1, -1)
logits = x @ a @ b @ c
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
