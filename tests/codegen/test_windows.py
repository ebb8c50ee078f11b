#!/usr/bin/python3
"""test_windows.py: which gradients of sliced tensors are assembled in place (meson test
`codegen-windows`; passes/memory_windows.c, docs/ir.md "Gradients of slices").

usage: /usr/bin/python3 tests/codegen/test_windows.py DMC SOURCE_ROOT

The numbers come from the slices' own arithmetic, not from a run of dmc: a parameter
read in k slices that tile a dim has k pieces in its gradient, each written into its
window, with no zero fill and no adds; a product's piece of a [C, 3, C] weight (gpt.dm's
fused q | k | v) has rows 3C apart in the gradient (3C / tensor on a tensor-split
weight), so the product's ldc is that. Slices that overlap or leave a row out keep the
pads (a zero fill each) and adds. PyTorch checks the values (tests/ref/ops/windows.dm in
ref-ops-pytorch, gpt.dm in ref-gpt-pytorch and the meshes of spmd-equivalence).

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run


def backward_of(code):
    return code[code.index("static int run_backward"):code.index("static int run_update")]


def pieces(code, grad, how):
    return len(re.findall(r"/\* \w+: \w+,? %s its window of %s \*/" % (how, grad), code))


def ldcs(code, pieces_of):
    """The ldc of each product whose result is a piece (named by its made-in comment)."""
    made = re.findall(r"/\* \w+: (\w+), made in its window of %s \*/" % pieces_of, code)
    shared = dict(re.findall(r"/\* (\w+) shares the buffer of (\w+) \*/", code))
    makers = {shared.get(m, m) for m in made}
    found = []
    for m in makers:
        call = re.search(r"dmrt_sgemm_split\([^;]*, %s, (\d+)\);" % m, code)
        if call:
            found.append(int(call.group(1)))
    return sorted(found)


def zero_filled(code, prefix):
    return len(re.findall(r"memset\(%s\w*, 0" % prefix, code))


def body(check, dmc, root, tmp):
    code = backward_of(generate(dmc, os.path.join(root, "tests/ref/ops/windows.dm"), [], tmp))
    C = 4
    check(pieces(code, "wr_grad", "made in") == 2, "windows.dm wr: 2 row windows made in place by products")
    check(ldcs(code, "wr_grad") == [C, C], "windows.dm wr: their products write rows of C (ldc %d)" % C)
    check(pieces(code, "wf_grad", "made in") == 3 and ldcs(code, "wf_grad") == [3 * C] * 3,
          "windows.dm wf: 3 strided windows made by products with ldc 3C = %d" % (3 * C))
    check(pieces(code, "bf_grad", "made in") == 3, "windows.dm bf: 3 bias rows made in place by reductions")
    check(pieces(code, "wc_grad", "copied into") == 2, "windows.dm wc: 2 unequal windows copied in")
    check(zero_filled(code, "d_w[rfbc]") == 0, "windows.dm: no zero fill for the tiled gradients")
    check(zero_filled(code, "d_wo") == 2 and "window of wo_grad" not in code,
          "windows.dm wo: overlapping windows keep their 2 pads")
    check(zero_filled(code, "d_wn") == 2 and "window of wn_grad" not in code,
          "windows.dm wn: a row no slice reads keeps the 2 pads")

    gpt = os.path.join(root, "examples/gpt.dm")
    dims = "V=64,T=16,C=32,NH=4,L=2,B=4"
    C, L = 32, 2
    for mesh, split in (([], 1), (["--mesh", "tensor=2"], 2), (["--mesh", "data=2"], 1)):
        out = os.path.join(tmp, "gpt%d" % len(os.listdir(tmp)))
        code = backward_of(generate(dmc, gpt, ["--set", dims] + mesh, out))
        label = "gpt.dm %s" % (" ".join(mesh) or "serial")
        # with data parallelism the pieces go to the pending sum the allreduce reads
        suffix = "_partial" if mesh == ["--mesh", "data=2"] else ""
        for l in range(L):
            weight = "h_%d_attn_c_attn_weight_grad%s" % (l, suffix)
            bias = "h_%d_attn_c_attn_bias_grad%s" % (l, suffix)
            check(pieces(code, weight, "made in") == 3,
                  "%s layer %d: q, k and v weight pieces made in %s" % (label, l, weight))
            check(ldcs(code, weight) == [3 * C // split] * 3,
                  "%s layer %d: their products' ldc is 3C / tensor = %d" % (label, l, 3 * C // split))
            check(pieces(code, bias, "made in") == 3, "%s layer %d: q, k and v bias pieces made in place" % (label, l))
        check(zero_filled(code, "d_h_\\d+_attn_c_attn_(?:weight|bias)") == 0,
              "%s: no zero fill of a fused q | k | v gradient (a bias piece's reduction zeroes its own row)" % label)


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-windows-", body))
