block f(x) {
    y = relu(x)
}
