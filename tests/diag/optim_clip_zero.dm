optimizer sgd(lr = 0.1, clip = 0)
