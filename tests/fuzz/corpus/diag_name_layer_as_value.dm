block double(x) {
    return x + x
}
layer d = double
y = d
