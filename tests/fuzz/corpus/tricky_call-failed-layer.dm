block f(x) {
return x
}
layer l = f[3]
input x : f32[3]
y = l(x)
