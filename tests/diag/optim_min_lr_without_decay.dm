optimizer sgd(lr = 0.1, min_lr = 0.01)
