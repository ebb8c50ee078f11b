block f(x) {
return x
}
layer h = repeat 4611686018427387903 f
