# A misspelt function or layer: the nearest of the functions and the layers in scope.
dim B = 4
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
}
input x : f32[B, 3]
layer encoder = linear[3, 2]
h = rleu(x)
y = encodr(h)
