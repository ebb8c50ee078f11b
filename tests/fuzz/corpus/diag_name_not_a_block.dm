dim B = 4
layer fc = B
