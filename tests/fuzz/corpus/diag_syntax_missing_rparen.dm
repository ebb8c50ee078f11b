# A call left open: the error is at the end of the line.
input x : f32[4]
y = relu(x
