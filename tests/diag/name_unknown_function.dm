input x : f32[4]
y = logsumexp(x)
