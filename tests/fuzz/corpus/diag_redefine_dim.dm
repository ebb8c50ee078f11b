dim B = 4
dim B = 8
