dim B = 2.5
