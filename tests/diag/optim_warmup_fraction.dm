optimizer adamw(warmup = 2.5)
