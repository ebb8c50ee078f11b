optimizer adamw(lr = 1e-3, beta2 = 1)
