# KNOWN BUG (or design gap): errors inside a block that no layer instantiates are
# never reported: dmc --check accepts this file.
# Expected: the error a layer of it would get (the unknown dtype).
block broken(x) {
    param w : f64[3] = bogus
    return x * w
}
