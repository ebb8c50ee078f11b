# The settings read before the program (mesh, schedule, accumulate) see the dims written
# before them, as every dim expression does: one declared after is unknown there; one whose
# definition fails is reported once, at the dim.
mesh(data = N)
dim N = 2
dim Q = 3 / 2
accumulate = Q
