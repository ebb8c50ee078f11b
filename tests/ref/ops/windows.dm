# windows.dm: gradients of tensors read in slices (tests/ref/test_ops.py); where the
# slices tile a dim, the sum of their pads is assembled in place (passes/memory_windows.c):
# products into windows of rows (wr), products into strided windows with a reduction's
# bias pieces (wf, bf: gpt.dm's fused q | k | v), pieces copied into windows of unequal
# sizes (wc); and sums left as pads and adds: overlapping windows (wo), a row no slice
# reads (wn). tests/codegen/test_windows.py checks which path each takes.
dim B = 2
dim T = 3
dim C = 4

input x : f32[B, T, C]
param wr : f32[2 * C, C] = normal(0, 0.5)
param wf : f32[C, 3, C] = normal(0, 0.5)
param bf : f32[3, C] = normal(0, 1)
param wo : f32[4, C] = normal(0, 0.5)
param wn : f32[3, C] = normal(0, 0.5)
param wc : f32[3, C] = normal(0, 0.5)

r1 = x @ slice(wr, 0, 0, C)                                        # [B, T, C]
r2 = x @ slice(wr, 0, C, 2 * C)
f0 = x @ reshape(slice(wf, 1, 0, 1), [C, C]) + reshape(slice(bf, 0, 0, 1), [C])
f1 = x @ reshape(slice(wf, 1, 1, 2), [C, C]) + reshape(slice(bf, 0, 1, 2), [C])
f2 = x @ reshape(slice(wf, 1, 2, 3), [C, C]) + reshape(slice(bf, 0, 2, 3), [C])
o1 = slice(wo, 0, 0, 3)                                            # [3, C]
o2 = slice(wo, 0, 1, 4)
n1 = slice(wn, 0, 0, 1)                                            # [1, C]
n2 = slice(wn, 0, 2, 3)
c1 = tanh(slice(wc, 0, 0, 1))                                      # [1, C]
c2 = tanh(slice(wc, 0, 1, 3))                                      # [2, C]
loss = mean(tanh(r1) * r2) + mean(tanh(f0) * f1 + f2 * f2) + mean(o1 * o2 * o1) + sum(n1 * n2 * n1) + mean(c2 * c1 * c1)

minimize loss
optimizer sgd(lr = 0.1)
