input logits : f32[4, 10]
input y : f32[4]
loss = cross_entropy(logits, y)
