# Poor: the failed dim L cascades into "unknown dimension 'L'".
block f(x) {
    return relu(x)
}
dim L = 0 * 4
layer h = repeat L f
