optimizer sgd(lr = -0.1)
