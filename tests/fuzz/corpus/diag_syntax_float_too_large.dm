optimizer sgd(lr = 1e999)
