# args: --set B=0
dim B = 4
input x : f32[B]
