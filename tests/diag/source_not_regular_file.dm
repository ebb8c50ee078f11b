# args: --teacher . --teacher-init run_diag.py
# A source that is a directory, not a regular file, is refused before anything is read from
# it (a FIFO would block, /dev/zero be read until memory ran out, a directory said only
# "read error"). The teacher's source is read as the student's (frontend/diag.c); the
# teacher's weights are only looked for under --check, so any file stands for them.
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
logits = x @ w
loss = cross_entropy(logits, y)
minimize loss
optimizer sgd(lr = 0.1)
