# Regression test: reshape's element count was not checked for overflow, so a shape
# whose product wraps around 2^64 to 24 was accepted: (2^61 + 3) * 8 = 2^64 + 24.
input x : f32[4, 6]
y = reshape(x, [2305843009213693955, 8])
