optimizer rmsprop(lr = 0.01)
