mesh(data = 2, data = 4)
