mesh(2)
