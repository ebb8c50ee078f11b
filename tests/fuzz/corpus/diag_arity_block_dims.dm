block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
}
layer fc = linear[3]
