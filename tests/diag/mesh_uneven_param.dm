mesh(tensor = 2)
dim V = 5
input ids : i32[3]
param table : f32[V@tensor, 4] = zeros
y = embed(table, ids)
loss = sum(y)
minimize loss
