dim B = 8
schedule 1f1b(microbatches = 4)
accumulate = 2
input x : f32[B, 3]
