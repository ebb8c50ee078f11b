# tied2bw.dm: a token embedding, a hidden layer and a head tied to the embedding, for the
# 2bw and pipedream schedules' tests of tied parameters (tests/ref/test_2bw.py,
# test_pipedream.py): on a pipeline the embedding's uses land on the first and the last
# stage, each of which holds a copy.
dim B = 16
dim T = 4
dim V = 32
dim C = 16

mesh(data = 1, tensor = 1, pipeline = 1)

input tokens  : i32[B@data, T]
input targets : i32[B@data, T]
param wte  : f32[V, C] = normal(0, 0.5)
param w1   : f32[C, C] = xavier
param w2   : f32[C, C] = xavier

x = embed(wte, tokens)
h1 = tanh(x @ w1)
h = tanh(h1 @ w2)
logits = h @ transpose(wte)
loss = cross_entropy(logits, targets)

minimize loss
optimizer sgd(lr = 0.5, momentum = 0.5)
