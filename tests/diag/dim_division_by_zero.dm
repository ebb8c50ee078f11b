# Dividing a dimension by zero says so (not "8 / 0 is not a whole number"); the one
# quotient past int64, INT64_MIN / -1, is an overflow, not a crash of the compiler.
dim B = 8 / 0
input x : f32[4]
y = reshape(x, [(0 - 4611686018427387903 * 2 - 2) / -1])
