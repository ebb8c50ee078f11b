# expand widens only dims of size 1 (and new leading ones), as torch.Tensor.expand
input x : f32[4, 2, 3]
y = expand(x, [4, 5, 3])
