block f(x) {
    output x
    return x
}
