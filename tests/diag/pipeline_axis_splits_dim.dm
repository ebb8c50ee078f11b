mesh(pipeline = 2)
input x : f32[4@pipeline, 3]
