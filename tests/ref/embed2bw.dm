# embed2bw.dm: a token embedding, a hidden layer and an untied head, for the 2bw schedule's
# test (tests/ref/test_2bw.py): on a pipeline, the first stage's owed backwards read the
# previous batch's token ids, which the step keeps.
dim B = 16
dim T = 4
dim V = 32
dim C = 16

mesh(data = 1, tensor = 1, pipeline = 1)

input tokens  : i32[B@data, T]
input targets : i32[B@data, T]
param wte  : f32[V, C] = normal(0, 0.5)
param w1   : f32[C, C] = xavier
param head : f32[C, V] = xavier

x = embed(wte, tokens)
h = tanh(x @ w1)
logits = h @ head
loss = cross_entropy(logits, targets)

minimize loss
optimizer sgd(lr = 0.5, momentum = 0.5)
