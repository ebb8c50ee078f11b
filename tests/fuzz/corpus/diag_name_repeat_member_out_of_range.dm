# Poor: two errors for one mistake.
block scale(x) {
    param w : f32[3] = ones
    return x * w
}
layer h = repeat 3 scale
w5 = h.5.w
