# args: --set h=8
# A --set name in the wrong case: the nearest dim, and all of them.
dim B = 4
dim H = 16
input x : f32[B, H]
