# Regression test: dmc crashed (SIGSEGV in call_layer, ir/lower.c) when a layer whose
# declaration failed was called. Only the error about the declaration is expected.
block double(x) {
    return x + x
}
layer d = double[3]
input x : f32[3]
y = d(x)
