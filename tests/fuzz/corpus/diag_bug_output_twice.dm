# KNOWN BUG: a value given twice to output is accepted, and the generated C then
# defines <model>_output_h twice, so it does not compile.
# Expected: an error (or the duplicate dropped, then move this case elsewhere).
input x : f32[2, 3]
h = relu(x)
output h, h
