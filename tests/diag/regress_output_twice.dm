# Regression: a value given twice to output was accepted, and the generated C then
# defined <model>_output_h twice. Now an error.
input x : f32[2, 3]
h = relu(x)
output h, h
