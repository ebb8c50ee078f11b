# forms.dm: the resharding collectives the examples do not reach, for the equivalence
# tests (tests/spmd). Megatron-LM's MLP in its all-gather form: a column-split layer's
# output is gathered whole for the next column-split layer (all-gather forward,
# reduce-scatter backward); a split moved from the hidden dim to the batch dim
# (all-to-all); a weight gathered for a matmul whose rows are split over its axis.

dim B = 16
dim D = 24
dim H = 32
dim K = 8

mesh(data = 1, tensor = 1)

block column_linear[IN, OUT](x) {
    param weight : f32[IN, OUT@tensor] = xavier
    param bias   : f32[OUT@tensor] = zeros
    return x @ weight + bias
}

input x : f32[B@data, D]
input y : i32[B@data]

layer fc1 = column_linear[D, H]
layer fc2 = column_linear[H, H]
layer fc3 = column_linear[H, K]

h1 : f32[B@data, H] = relu(fc1(x)) # the all-gather form: gathered whole over tensor
h2 = relu(fc2(h1))                  # [B@data, H@tensor]: fc2 column-split too
rows : f32[B@tensor, H] = h2 * 0.5  # hidden split moved to the rows
logits = fc3(rows)                  # fc3's weight gathered: the rows hold tensor
loss = cross_entropy(logits, y)

output logits
minimize loss
optimizer adamw(lr = 1e-2, weight_decay = 1e-4)
