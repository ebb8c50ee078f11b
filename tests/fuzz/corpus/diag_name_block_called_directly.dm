block double(x) {
    return x + x
}
input x : f32[3]
y = double(x)
