# Reserved words where a name is expected: each says it is one (docs/language.md lists them).
dim repeat = 4
input as : f32[4]
param zero : f32[4] = zeros
layer accumulate = lin[4, 4]
block output(x) {
    return x
}
block lin[repeat](x) { return x }
schedule = x * 2
input : f32[4]
y = zero * 2
z = relu(x) + mesh
output block
minimize schedule
