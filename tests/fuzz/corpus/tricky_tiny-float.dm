optimizer sgd(lr = 1e-99999)
