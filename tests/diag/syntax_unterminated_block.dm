# Poor: nothing points at the unclosed {.
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    return x @ weight
