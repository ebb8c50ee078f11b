# slice_views.dm: windows of parameters read where they lie, not copied
# (passes/slice_views.c; tests/ref/test_ops.py checks the numbers against PyTorch,
# tests/codegen/test_slice_views.py which windows are read in place): windows of columns
# whose rows are apart, read by products as their right operand (plain and transposed) and
# as both operands; contiguous windows (a vector's, a stack's matrix through a reshape);
# and the windows that stay copies: a strided window read by tanh, an activation's window.
dim B = 2
dim T = 3
dim C = 4

input x : f32[B, T, C]
param ws : f32[C, 2 * C] = normal(0, 0.5)
param wa : f32[C, 3 * C] = normal(0, 0.5)
param we : f32[C, 2 * C] = normal(0, 0.5)
param wm : f32[2, C, C] = normal(0, 0.5)
param bv : f32[2 * C] = normal(0, 1)

s1 = x @ slice(ws, 1, 0, C)                                   # rows 2C apart
s2 = x @ transpose(slice(ws, 1, C, 2 * C))                    # transposed: still rows 2C apart
m = slice(wa, 1, C, 2 * C) @ slice(wa, 1, 2 * C, 3 * C)       # both operands, rows 3C apart
s3 = x @ m + slice(bv, 0, 0, C)                               # a vector's window: contiguous
e = tanh(slice(we, 1, 1, C + 1))                              # strided, read by tanh: copied
s4 = x @ reshape(slice(wm, 0, 1, 2), [C, C]) + slice(bv, 0, C, 2 * C)
h = tanh(s1 * s2)
first = slice(h, 0, 0, 1)                                     # an activation's window: copied
loss = mean(h * s3) + mean((x @ e) * s4) + mean(first * first)

minimize loss
optimizer sgd(lr = 0.1)
