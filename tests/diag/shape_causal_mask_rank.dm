input v : f32[5]
m = causal_mask(v)
w = v @ transpose(v)
