block double(x) {
    return x + x
}
layer d = double
input x : f32[3]
y = d[3](x)
