mesh(data = 2)
mesh(tensor = 2)
