# A setting given twice in one call would silently take the last value: an error at the
# second, with a note at the first (an optimizer's settings, its decay, a schedule's).
dim B = 8
dim D = 4
schedule gpipe(microbatches = 2, microbatches = 4)
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 1, momentum = 0.9, lr = 2, decay = cosine, decay = linear)
