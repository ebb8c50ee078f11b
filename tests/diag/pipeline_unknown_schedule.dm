dim B = 8
schedule zerobubble(microbatches = 4)
input x : f32[B, 3]
