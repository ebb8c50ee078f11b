#!/usr/bin/python3
"""test_loss_grad16.py: the classifier's gradient made in the products' 16-bit type
(meson test `codegen-loss-grad16`; passes/precision.c, docs/precision.md).

usage: /usr/bin/python3 tests/codegen/test_loss_grad16.py DMC SOURCE_ROOT

Under --precision bf16 or fp16, gpt.dm's logits gradient is read only by the tied head's
two products, so it is made in 16 bits by the cross-entropy gradient itself (no f32
gradient, no cast of it) on both targets. mlp.dm's is also read by fc3's bias gradient (a sum in f32), so it
stays f32 and is cast. PyTorch checks the values (ref-bf16-pytorch, ref-fp16-pytorch,
ref-precision-quality); here, that its loop takes each value from f32's expf (the f32
gradient's from a double exp).

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run


def body(check, dmc, root, tmp):
    gpt, mlp = os.path.join(root, "examples/gpt.dm"), os.path.join(root, "examples/mlp.dm")
    B, T, V = 4, 16, 64
    dims = ["--set", "V=%d,T=%d,C=32,NH=4,L=2,B=%d" % (V, T, B)]
    for prec, dtype in (("bf16", "bf16"), ("fp16", "f16")):
        code = generate(dmc, gpt, dims + ["--precision", prec], os.path.join(tmp, prec))
        check(re.search(r"/\* d_logits = cross_entropy_grad : %s\[B, T, V\] \*/" % dtype, code) is not None
              and "d_logits_%s = cast" % dtype not in code,
              "gpt.dm %s: d_logits made in %s by the gradient, no cast of it" % (prec, dtype))
        check(len(re.findall(r"dmrt_gemm_%s_split\([^;]*\bd_logits, %d," % (dtype, V), code)) == 2,
              "gpt.dm %s: the head's two products read it" % prec)
        check("drow[c] = dmrt_%s_round(expf(row[c] - stats[0]) / stats[1] * scale);" % dtype in code,
              "gpt.dm %s: each value from f32's expf, which vectorises, rounded once" % prec)
        cuda = generate(dmc, gpt, dims + ["--precision", prec, "--target", "cuda"], os.path.join(tmp, prec + "cu"), ".cu")
        check("dmrt_gpu_cross_entropy_grad_half(ctx->gpu, %d, " % (prec == "bf16") in cuda,
              "gpt.dm %s --target cuda: dmrt_gpu_cross_entropy_grad_half writes it" % prec)
    code = generate(dmc, gpt, dims, os.path.join(tmp, "f32"))
    check("/* d_logits = cross_entropy_grad : f32[B, T, V] */" in code, "gpt.dm f32: d_logits stays f32")
    check("drow[c] = (float)(exp((double)(row[c] - stats[0])) / (double)stats[1]) * scale;" in code,
          "gpt.dm f32: each value through a double exp, as the forward's sum")
    code = generate(dmc, mlp, ["--precision", "bf16"], os.path.join(tmp, "mlp"))
    check(re.search(r"/\* d_logits = cross_entropy_grad : f32\[", code) is not None and "d_logits_bf16 = cast" in code,
          "mlp.dm bf16: d_logits, also read by a bias's sum, stays f32 and is cast")


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-loss-grad16-", body))
