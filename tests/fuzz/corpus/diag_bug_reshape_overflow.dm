# KNOWN BUG: reshape's element count is not checked for overflow, so a shape whose
# product wraps around 2^64 to 24 is accepted: (2^61 + 3) * 8 = 2^64 + 24.
# (ir_numel in ir/ir.c multiplies without a check; the type check in lower.c does.)
# Expected: an error that the new shape is too large.
input x : f32[4, 6]
y = reshape(x, [2305843009213693955, 8])
