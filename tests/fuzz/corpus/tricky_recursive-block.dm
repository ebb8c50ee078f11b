block f(x) {
layer g = f
return g(x)
}
layer h = f
