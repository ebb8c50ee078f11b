dim B = 4 / 0
