dim D = 4
layer fc = dense[D, D]
