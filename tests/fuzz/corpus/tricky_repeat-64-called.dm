block f(x) {
param w : f32[2] = ones
return relu(x * w)
}
layer h = repeat 64 f
input x : f32[2]
l = sum(h(x))
minimize l
optimizer adamw(lr = 0.1)
