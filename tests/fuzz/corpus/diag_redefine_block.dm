block f(x) {
    return x
}
block f(x) {
    return relu(x)
}
