block f(x) {
    return x
}
layer l = f
layer l = f
