optimizer sgd(lr = 0.1, nesterov = true)
