input labels : i32[4]
y = relu(labels)
