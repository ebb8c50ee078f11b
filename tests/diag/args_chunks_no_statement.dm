# args: --chunks 3
# --chunks where no statement of the program is about the schedule (no schedule, no
# pipeline axis): a command-line error, `dmc: error: ...`, not FILE:0:0 without a line.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
