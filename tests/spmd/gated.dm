# gated.dm: LLaMA's pieces for the equivalence tests (tests/spmd): RMSNorm written with a
# kept-dim mean, x * rsqrt(mean(x * x, -1, keepdim = true) + eps) * weight, in a block
# that knows only its width, and the SwiGLU MLP, down(silu(gate(x)) * up(x)), its gate
# and up column-split and its down row-split over tensor; the last norm reads rows whose
# width is split over tensor, so its mean square is a partial sum.

dim B = 16
dim D = 32
dim H = 64
dim K = 8

mesh(data = 1, tensor = 1)

block rmsnorm[C](x) {
    param weight : f32[C] = ones
    return x * rsqrt(mean(x * x, -1, keepdim = true) + 1e-5) * weight
}

block swiglu[C, F](x) {
    param gate : f32[C, F@tensor] = xavier
    param up   : f32[C, F@tensor] = xavier
    param down : f32[F@tensor, C] = xavier
    return (silu(x @ gate) * (x @ up)) @ down
}

block decoder[C, F](x) {
    layer norm = rmsnorm[C]
    layer mlp = swiglu[C, F]
    return x + mlp(norm(x))
}

input x : f32[B@data, D]
input y : i32[B@data]

param embed : f32[D, D] = xavier
layer layers = repeat 2 decoder[D, H]
layer norm = rmsnorm[D]
param head : f32[D, K] = xavier

h = layers(x @ embed)
wide : f32[B@data, D@tensor] = h    # the width split: the norm's mean square is partial
logits = norm(wide) @ head
loss = cross_entropy(logits, y)

minimize loss
optimizer sgd(lr = 0.1)   # AdamW would divide float rounding by tiny gradients (tests/spmd/test_equivalence.py)
