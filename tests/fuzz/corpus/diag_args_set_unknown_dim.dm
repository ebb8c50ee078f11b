# args: --set Q=3
dim B = 4
input x : f32[B]
