optimizer sgd
