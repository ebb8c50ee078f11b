input x: f32[4, 3]
block f(x) {
    y = relu(x)
    return y
    z = nosuchfn(y)
    return z
}
layer g = f
loss = sum(g(x))
