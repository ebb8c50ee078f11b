dim A = 4000000000
dim B = A * A * A
