dim B = 4
dim K = 10
input logits : f32[B, K]
input y : i32[K]
loss = cross_entropy(logits, y)
