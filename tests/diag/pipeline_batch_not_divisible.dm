dim B = 6
schedule gpipe(microbatches = 4)
input x : f32[B, 3]
