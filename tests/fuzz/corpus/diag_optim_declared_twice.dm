optimizer sgd(lr = 0.1)
optimizer adamw(lr = 1e-3)
