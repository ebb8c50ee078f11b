# args: --accumulate 2
# a parameter shaped by the batch dim would be made at a micro-batch's size
dim B = 4
dim C = 3
input ids : i32[B]
input y : i32[B]
param table : f32[B, C] = xavier
loss = cross_entropy(embed(table, ids), y)
minimize loss
optimizer sgd(lr = 0.1)
