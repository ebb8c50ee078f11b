# args: --microbatches 2
input x : f32[8, 3]
