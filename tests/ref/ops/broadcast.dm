# broadcast.dm: NumPy broadcasting with parameters on both sides, so the gradients
# reduce (sum_to) on both sides; scalars; division by a parameter (tests/ref/test_ops.py).
dim B = 5
dim H = 7

input x : f32[B, H]
param w : f32[H] = normal(0, 1)
param col : f32[B] = normal(0, 1)
param s : f32[] = ones             # a scalar parameter
param d : f32[H] = ones            # a denominator (positive: set by --init)
param row : f32[1, H] = normal(0, 1)
param m : f32[B, H] = normal(0, 1)

c2 = reshape(col, [B, 1])          # a parameter whose gradient comes out of a reshape
y1 = x * w + c2                    # [B, H] * [H] + [B, 1]
y2 = (y1 - s) / d                  # scalar and a [H] denominator
y3 = w * c2                        # [H] * [B, 1]: both params reduce
y4 = row - c2                      # [1, H] - [B, 1]
y5 = m / (s * d + c2 * c2)         # denominator [B, H] built from three params
y6 = s * m + row / s               # scalar times a matrix, and divides
z = tanh(y2) * y3 + sigmoid(y4) * y5 + y6 * x
loss = mean(z * z) + s * s / 4

minimize loss
optimizer sgd(lr = 0.1)
