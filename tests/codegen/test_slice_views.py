#!/usr/bin/python3
"""test_slice_views.py: which windows of parameters are read in place (meson test
`codegen-slice-views`; passes/slice_views.c, docs/compiler.md "slice_views").

usage: /usr/bin/python3 tests/codegen/test_slice_views.py DMC SOURCE_ROOT

The numbers come from the windows' own arithmetic, not from a run of dmc: a window of
columns [P, P + w) of a parameter whose rows are n long has its rows n apart, so every
product reading it passes n as its lda or ldb; gpt.dm's q, k and v windows of the [C, 3, C]
c_attn weight have rows 3C apart (3C / tensor on a tensor-split weight), forward and
backward. A window read by anything but a product, a window of an activation, a window
read by a cast (--precision bf16) keep their copies; under --quantize the windows are no
copies either, their products reading columns 0, C and 2C of the narrow c_attn; a window
that something else also reads (a product of its transpose) stays a copy there, and its
products stay f32, on both targets.
PyTorch checks the values (tests/ref/ops/slice_views.dm in ref-ops-pytorch, gpt.dm in
ref-gpt-pytorch and the meshes of spmd-equivalence).

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run


def in_place(code, param):
    """{window: rows apart (0: contiguous)} of the windows of param read in place."""
    found = {}
    for name, rows in re.findall(r"/\* (\w+) is read in place: its window of %s(?:, rows (\d+) apart)?" % param, code):
        found[name] = int(rows) if rows else 0
    return found


def copied(code, name):
    """Whether a loop writes window `name` (a copy of it)."""
    return re.search(r"\b%s\[[^]]*\] = " % name, code) is not None


def operand_lds(code, name):
    """The leading dimension passed with `name` in every product that reads it."""
    return [int(ld) for ld in re.findall(r"dmrt_(?:sgemm|gpu_sgemm)\w*\([^;]*?\b%s, (\d+)," % name, code)]


MIXED_WINDOWS = """dim B = 4
dim C = 8
input x : f32[B, C]
input y : i32[B]
param weight : f32[C, 3, C] = normal(0, 0.02)
w0 = reshape(slice(weight, 1, 1, 2), [C, C])
w1 = reshape(slice(weight, 1, 2, 3), [C, C])
logits = x @ w0 + x @ transpose(w0) + x @ w1
loss = cross_entropy(logits, y)
output logits
minimize loss
optimizer sgd(lr = 0.1)
"""


def body(check, dmc, root, tmp):
    C = 4
    code = generate(dmc, os.path.join(root, "tests/ref/ops/slice_views.dm"), [], os.path.join(tmp, "ops"))
    ws, wa = in_place(code, "ws"), in_place(code, "wa")
    check(sorted(ws.values()) == [2 * C, 2 * C], "slice_views.dm ws: 2 windows of columns in place, rows 2C apart")
    check(sorted(wa.values()) == [3 * C, 3 * C], "slice_views.dm wa: 2 windows of columns in place, rows 3C apart")
    check(sorted(in_place(code, "bv").values()) == [0, 0], "slice_views.dm bv: the vector's 2 windows in place")
    check(sorted(in_place(code, "wm").values()) == [0], "slice_views.dm wm: the stack's matrix in place")
    for name, rows in list(ws.items()) + list(wa.items()):
        lds = operand_lds(code, name)
        check(lds and all(ld == rows for ld in lds) and not copied(code, name),
              "slice_views.dm %s: not copied; its %d products' ld is %d (%s)" % (name, len(lds), rows, lds))
    check(not in_place(code, "we") and re.search(r"= we\[1 \+ ", code) is not None,
          "slice_views.dm we: a strided window read by tanh is copied")
    check(copied(code, "first") and not in_place(code, "h"), "slice_views.dm: an activation's window is copied")

    gpt = os.path.join(root, "examples/gpt.dm")
    dims = "V=64,T=16,C=32,NH=4,L=2,B=4"
    C, L = 32, 2
    for mesh, split in (([], 1), (["--mesh", "tensor=2"], 2), (["--mesh", "data=2"], 1)):
        label = "gpt.dm %s" % (" ".join(mesh) or "serial")
        code = generate(dmc, gpt, ["--set", dims] + mesh, os.path.join(tmp, "gpt%d" % split + "".join(mesh)))
        for l in range(L):
            weight = in_place(code, "h_%d_attn_c_attn_weight" % l)
            bias = in_place(code, "h_%d_attn_c_attn_bias" % l)
            check(sorted(weight.values()) == [3 * C // split] * 3,
                  "%s layer %d: q, k and v weight windows in place, rows 3C / tensor = %d apart" % (label, l, 3 * C // split))
            check(sorted(bias.values()) == [0] * 3, "%s layer %d: q, k and v bias windows in place" % (label, l))
            # each window is read by reshapes: the forward product and the backward's dx product
            lds = []
            for window in weight:
                for reshape in re.findall(r"/\* (\w+) shares the buffer of %s \*/" % window, code):
                    lds += operand_lds(code, reshape)
            check(len(lds) >= 6 and all(ld == 3 * C // split for ld in lds),
                  "%s layer %d: the %d products reading them pass ld %d" % (label, l, len(lds), 3 * C // split))

    code = generate(dmc, gpt, ["--set", dims, "--precision", "bf16"], os.path.join(tmp, "bf16"))
    check(not in_place(code, "h_0_attn_c_attn_weight") and len(in_place(code, "h_0_attn_c_attn_bias")) == 3,
          "gpt.dm bf16: the weight windows, read by casts, are copied; the bias windows are in place")
    # --quantize: the products read their columns of the narrow weight (passes/quantize.c)
    for mode, call in (("int8-weights", "dmrt_gemm_wq_window_split"), ("int8", "dmrt_gemm_i8_window_split")):
        code = generate(dmc, gpt, ["--set", dims, "--quantize", mode], os.path.join(tmp, "quant-" + mode))
        windows = sorted(int(c0) for c0 in re.findall(r"%s\(ctx->threads, &ctx->quant\[0\], (?:[^,]+, )?(\d+), %d," % (call, C),
                                                           code))
        check(sorted(in_place(code, "h_0_attn_c_attn_weight").values()) == [3 * C] * 3 and windows == [0, C, 2 * C],
              "gpt.dm --quantize %s: the weight windows no copies; its 3 products read columns %s of the narrow "
              "weight by %s" % (mode, windows, call))
    # a window something else also reads (a product of its transpose) stays a copy, and its
    # products f32: a quantized window's call reads the narrow weight's columns in place
    mixed = os.path.join(tmp, "mixed.dm")
    with open(mixed, "w") as f:
        f.write(MIXED_WINDOWS)
    for target, ext, call in (("c", ".c", "dmrt_gemm_wq_window_split"), ("cuda", ".cu", "dmrt_gpu_gemm_wq_window")):
        code = generate(dmc, mixed, ["--quantize", "int8-weights", "--target", target], os.path.join(tmp, "mixed-" + target), ext)
        check(list(in_place(code, "weight").values()) == [24] and code.count(call + "(") == 1,
              "--quantize --target %s: only the window read by products alone (w1) is in place, its one product "
              "quantized (%s); w0, also read transposed, a copy multiplied in f32" % (target, call))
    code = generate(dmc, gpt, ["--set", dims, "--target", "cuda"], os.path.join(tmp, "cuda"), ".cu")
    check(sorted(in_place(code, "h_0_attn_c_attn_weight").values()) == [3 * C] * 3,
          "gpt.dm --target cuda: the weight windows in place, rows 3C apart")


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-slice-views-", body))
