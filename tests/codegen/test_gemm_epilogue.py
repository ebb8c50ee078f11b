#!/usr/bin/python3
"""test_gemm_epilogue.py: biases added and their gradients summed by the products' own calls
(meson test `codegen-gemm-epilogue`; codegen/emit_bias_grad.c, emit_ops.c's emit_product,
runtime/cuda/gemm_epilogue.cu, docs/compiler.md "Products").

usage: /usr/bin/python3 tests/codegen/test_gemm_epilogue.py DMC SOURCE_ROOT

The counts come from gpt.dm's blocks, not from a run of dmc: each of the L blocks has six
linear layers with a bias (c_attn's q, k and v windows, attn.c_proj, mlp.c_fc, mlp.c_proj).
Forward, five biases are added by their product's call (c_fc's is added by GELU's pass);
backward, the six biases' gradients are summed by their weight gradient's product, whose k
runs over the B*T rows of the output's gradient: on the CUDA target one
dmrt_gpu_gemm_epilogue call each (cuBLASLt's epilogues), on the C target the product and
dmrt_sum_rows_split. The only generated CUDA kernels left in a step are then x = wte + wpe,
GELU and its gradient, and the two embeddings' gradients: 2L + 3. Not folded: pipelines
with micro-batches (the bias sums stay loops) and 16-bit products (they read dy's 16-bit
copy, and every mesh's bias gradient must be the same f32 sum). The C target runs the same plan, so every PyTorch oracle of gpt.dm (ref-gpt-pytorch,
the spmd suite) checks the values these calls make there; the CUDA runtime's are checked
by gpu-kernels on a GPU.

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run

L, B, T, C, V = 2, 4, 16, 32, 64
DIMS = "V=%d,T=%d,C=%d,NH=4,L=%d,B=%d" % (V, T, C, L, B)
ROWS = B * T
EPILOGUE = re.compile(r"dmrt_gpu_gemm_epilogue\(ctx->gpu, DMRT_GPU_OPERANDS_(\w+), (\d), (\d), (\d+), (\d+), (\d+), (\w+), "
                      r"(\d+), (\w+), (\d+), ([\d.]+f), (\w+), (\d+), (\w+), (\w+)\)")


def cuda_calls(code):
    return [dict(zip(("operands", "ta", "tb", "m", "n", "k", "a", "lda", "b", "ldb", "beta", "c", "ldc", "bias",
                      "bias_grad"), c)) for c in EPILOGUE.findall(code)]


def check_sums_folded(check, label, code, sums_line):
    """Each folded sum_to's comment is followed by the product's call making it."""
    folded = re.findall(r"/\* (\w+) = sum_to : f32\[(\w+)\](?:{\+data})? \*/\n\s*/\* (\w+), made here for the sum \1 of (\w+)'s rows",
                        code)
    check(len(folded) == 6 * L, "gpt.dm %s: %d bias gradients made by their weight's product (%d: %s)"
          % (label, 6 * L, len(folded), [f[0] for f in folded][:6]))
    later = [p for _, _, p, _ in folded if re.search(r"/\* %s = matmul : [^*]*\*/\n\s*/\* computed with the sum \w+, above \*/"
                                                  % p, code)]
    check(len(later) == len(folded), "gpt.dm %s: each such product's own place says it was made above" % label)
    check(len(re.findall(sums_line, code)) == 6 * L, "gpt.dm %s: %d calls sum the bias gradients" % (label, 6 * L))
    return folded


def body(check, dmc, root, tmp):
    gpt = os.path.join(root, "examples/gpt.dm")

    # a data=2 rank's products run over its half of the batch's rows
    for label, args, rows in (("cuda", [], ROWS), ("cuda data=2", ["--mesh", "data=2"], ROWS // 2)):
        code = generate(dmc, gpt, ["--set", DIMS, "--target", "cuda"] + args, os.path.join(tmp, label.replace(" ", "_")), ".cu")
        calls = cuda_calls(code)
        with_bias = [c for c in calls if c["bias"] != "NULL"]
        check(len(with_bias) == 5 * L and all(c["bias_grad"] == "NULL" and c["beta"] == "0.0f" for c in with_bias),
              "gpt.dm %s: %d products add their bias (beta 0)" % (label, 5 * L))
        check(all(c["operands"] == "F32" and (c["ta"], c["tb"]) == ("0", "0") and int(c["m"]) == rows for c in with_bias),
              "gpt.dm %s: each over the %d rows of its input, f32" % (label, rows))
        grads = [c for c in calls if c["bias_grad"] != "NULL"]
        check(len(grads) == 6 * L, "gpt.dm %s: %d products sum a bias's gradient" % (label, 6 * L))
        check(all((c["ta"], c["tb"]) == ("1", "0") and int(c["k"]) == rows and c["bias"] == "NULL" for c in grads),
              "gpt.dm %s: each a weight gradient x^T dy over the %d rows (a transposed, b not)" % (label, rows))
        folded = check_sums_folded(check, label, code, r"dmrt_gpu_gemm_epilogue\([^;]*, NULL, \w+\)")
        pairs = {(s, dy) for s, _, _, dy in folded}
        check(all((c["bias_grad"], c["b"]) in pairs for c in grads),
              "gpt.dm %s: each call sums the rows of the gradient its sum_to read" % label)
        q_window = [c for c in grads if c["ldc"] == str(3 * C)]
        check(len(q_window) == 3 * L, "gpt.dm %s: c_attn's q, k and v weight gradients written in their windows (ldc %d)"
              % (label, 3 * C))
        # a data-parallel rank's layernorm bias sums are folded where the memory plan lets them
        # (partial gradients in the arena: codegen/emit_bias_grad.c's cg_may_make_early)
        kernels = len(re.findall(r"<<<", code)) - len(re.findall(r"\bk\d+_\w*ln_\w*_bias_grad\w*<<<", code))
        check(kernels == 2 * L + 3, "gpt.dm %s: %d generated kernel launches a step besides layernorm bias sums, %d expected"
              % (label, kernels, 2 * L + 3))

    code = generate(dmc, gpt, ["--set", DIMS], os.path.join(tmp, "c"), ".c")
    check_sums_folded(check, "C target", code, r"dmrt_sum_rows_split\(ctx->threads, %d, \d+, \w+, \d+, \w+\);" % ROWS)
    check("dmrt_gpu_gemm_epilogue" not in code, "gpt.dm C target: no CUDA call")

    # 16-bit products read dy's 16-bit copy: their bias gradients keep the f32 sums every mesh makes
    for precision in ("bf16", "fp16"):
        code = generate(dmc, gpt, ["--set", DIMS, "--target", "cuda", "--precision", precision], os.path.join(tmp, precision),
                        ".cu")
        calls = cuda_calls(code)
        if precision == "bf16":
            check(len([c for c in calls if c["bias"] != "NULL" and c["operands"] == "BF16"]) == 5 * L,
                  "gpt.dm cuda bf16: %d bf16 products add their bias" % (5 * L))
        check(not [c for c in calls if c["bias_grad"] != "NULL"] and "made here for the sum" not in code,
              "gpt.dm cuda %s: the bias gradients keep their f32 sums" % precision)
    code = generate(dmc, gpt, ["--set", DIMS, "--target", "cuda", "--mesh", "pipeline=2", "--microbatches", "2"],
                    os.path.join(tmp, "pipe"), ".cu")
    check("made here for the sum" not in code and not [c for c in cuda_calls(code) if c["bias_grad"] != "NULL"],
          "gpt.dm cuda pipeline=2 x 2 micro-batches: the bias gradients keep their sums")


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-gemm-epilogue-", body))
