# args: --sequence-parallel --mesh data=2
mesh(data = 1, pipeline = 1)
