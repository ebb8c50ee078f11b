# A misspelt value or dimension: the nearest name in scope.
dim Batch = 4
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ wieght
}
input tokens : f32[Bacth, 3]
input x : f32[Batch, 3]
layer fc = linear[3, 2]
y = fc(x)
z = relu(token)
