optimizer sgd(0.1)
