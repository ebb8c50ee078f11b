# Regression: a later let naming the same value renamed it, so `output h` became
# <model>_output_y. The value keeps the first name it was given. (Lowering only: the
# program trains nothing, which the passes after it reject.)
input x : f32[2, 3]
h = relu(x)
y = h
output h
