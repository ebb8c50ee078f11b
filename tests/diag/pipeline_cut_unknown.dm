dim B = 8
mesh(pipeline = 2)
schedule gpipe(microbatches = 2, cuts = [nothing])
input x : f32[B, 3]
h = relu(x)
