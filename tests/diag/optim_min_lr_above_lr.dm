optimizer adamw(lr = 1e-3, decay = linear, min_lr = 1e-2)
