# args: --set B=0
# Poor: the error points at `dim B = 4` (the 0 came from --set), and B then cascades
# into "unknown dimension 'B'".
dim B = 4
input x : f32[B]
