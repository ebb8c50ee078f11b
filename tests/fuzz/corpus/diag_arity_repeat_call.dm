block add(a, b) {
    return a + b
}
layer h = repeat 2 add
input x : f32[3]
y = h(x, x)
