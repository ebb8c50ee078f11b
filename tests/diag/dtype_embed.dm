dim V = 10
dim C = 4
param table : f32[V, C] = zeros
input ids : f32[3]
e = embed(table, ids)
input idx : i32[3]
f = embed(idx, idx)
