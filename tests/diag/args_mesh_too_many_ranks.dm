# args: --mesh data=2048,tensor=1024
# The cap on the mesh's ranks holds after --mesh too: the sizes it made, at the mesh.
mesh(data = 1, tensor = 1)
dim B = 8
dim D = 4
input x : f32[B, D]
input y : i32[B]
param w : f32[D, D] = xavier
loss = cross_entropy(x @ w, y)
minimize loss
optimizer sgd(lr = 0.1)
