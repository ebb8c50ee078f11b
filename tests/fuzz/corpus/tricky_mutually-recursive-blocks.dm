block f(x) {
layer a = g
return a(x)
}
block g(x) {
layer b = f
return b(x)
}
layer h = f
