block f(x) {
return relu(x)
}
layer h = repeat 1000000 f
