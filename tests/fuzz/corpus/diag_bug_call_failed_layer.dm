# KNOWN BUG: dmc crashes (SIGSEGV in call_layer, ir/lower.c) when a layer whose
# declaration failed is called: the layer stays bound with no instance.
# Expected: only the error about the declaration.
block double(x) {
    return x + x
}
layer d = double[3]
input x : f32[3]
y = d(x)
