# Poor: an error in a block's body is reported again at every call of a layer of it
# (a and b here); once would do.
block f(x) {
    y = logsumexp(x)
    return y
}
layer a = f
layer b = f
input x : f32[3]
p = a(x)
q = b(x)
r = a(p)
