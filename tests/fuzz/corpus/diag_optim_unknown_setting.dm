optimizer sgd(learning_rate = 0.1)
