# Regression test: dmc crashed (SIGSEGV in call_layer, ir/lower.c) when a repeated
# layer whose count could not be evaluated was called. Only that error is expected.
block double(x) {
    return x + x
}
layer h = repeat L double
input x : f32[3]
y = h(x)
