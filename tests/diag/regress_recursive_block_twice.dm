# Regression: a block that instantiates itself twice once ran out of memory, then
# reported the nesting error once per instance. Now one error.
block f(x) {
    layer a = f
    layer b = f
    return x
}
layer l = f
