block f(x) {
    layer inner = f
    return inner(x)
}
layer l = f
