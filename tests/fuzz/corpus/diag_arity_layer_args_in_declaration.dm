block double(x) {
    return x + x
}
input x : f32[3]
layer d = double(x)
