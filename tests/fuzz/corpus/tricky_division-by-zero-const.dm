optimizer sgd(lr = 1 / 0)
