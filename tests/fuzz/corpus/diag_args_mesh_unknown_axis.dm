# args: --mesh model=2
mesh(data = 2)
