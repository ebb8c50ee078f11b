optimizer adamw(lr = 6e-4, warmup = 100, decay = exponential)
