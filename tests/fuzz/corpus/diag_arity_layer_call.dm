block add(a, b) {
    return a + b
}
layer l = add
input x : f32[3]
y = l(x)
