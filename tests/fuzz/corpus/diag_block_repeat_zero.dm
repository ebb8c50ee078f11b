block f(x) {
    return relu(x)
}
dim L = 0 * 4
layer h = repeat L f
