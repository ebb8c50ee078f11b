mesh(data = 0)
