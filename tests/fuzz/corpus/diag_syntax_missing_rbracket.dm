# A type whose bracket is never closed: newlines inside [ ] are spaces, so the
# parser only notices on the next line.
dim B = 4
input x : f32[B, 3
y = relu(x)
