# Regression test: dmc crashed (SIGSEGV in call_layer, ir/lower.c) when a repeated
# layer whose members could not be made was called. Only that error is expected.
block double(x) {
    return x + x
}
layer h = repeat 2 double[3]
input x : f32[3]
y = h(x)
