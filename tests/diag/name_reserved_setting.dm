# zero and accumulate are settings (`zero = N`, `accumulate = N`): a value named so says
# that the word is reserved.
input x : f32[4]
param w : f32[4] = zeros
h = x * w
zero = relu(h)
accumulate = h
loss = mean(h)
minimize loss
optimizer sgd()
