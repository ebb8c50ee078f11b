# An input may not reuse the name of a dimension.
dim x = 4
input x : f32[x]
