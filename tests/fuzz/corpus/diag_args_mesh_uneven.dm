# args: --mesh data=3
mesh(data = 2)
input x : f32[4@data]
