# KNOWN BUG: dmc crashes (SIGSEGV in call_layer, ir/lower.c) when a repeated layer
# whose count could not be evaluated is called.
# Expected: only the error about the count.
block double(x) {
    return x + x
}
layer h = repeat L double
input x : f32[3]
y = h(x)
