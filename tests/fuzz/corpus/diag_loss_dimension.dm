dim B = 4
minimize B
