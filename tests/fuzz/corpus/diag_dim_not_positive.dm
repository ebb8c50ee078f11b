dim B = 4 - 4
