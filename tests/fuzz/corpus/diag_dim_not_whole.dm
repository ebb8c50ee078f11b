dim B = 10
dim H = B / 4
