# A concat on a pipeline stage after the one making what it joins (test_concat_cut.py).
# concat lowers to pads writing into the concat's buffer (passes/memory_windows.c); the cut
# after z puts logits' pads on stage 1 reading z from stage 0, and sc's pads reading s, a
# value made from a parameter alone. Both must be sent to stage 1.
mesh(data = 1, tensor = 1, pipeline = 1)
dim B = 8
dim T = 4
dim C = 8
dim V = 4
dim K = 2
input x : f32[B, T, C]
input y : i32[B, T]
param emb : f32[V, C] = normal(0, 0.5)
param w1 : f32[C, C] = normal(0, 0.3)
s = softmax(w1, 1)
h = tanh(x @ w1) + embed(emb, y)
param w2 : f32[C, K] = uniform(-0.5, 0.5)
z = h @ w2
logits = concat(z, z, dim = -1)
sc = concat(s, s, dim = -1)
loss = cross_entropy(logits, y) + mean(sc * sc)
minimize loss
optimizer adamw(lr = 0.05)
schedule gpipe(microbatches = 2, cuts = [z])
