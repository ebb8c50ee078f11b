# precision names the products' dtype: fp32, bf16 or fp16; tf32 is the CUDA target's
# command-line choice (--tf32), not the program's.
input x : f32[4, 4]
param w : f32[4, 4] = zeros
precision tf32
loss = mean(x @ w)
minimize loss
optimizer sgd()
