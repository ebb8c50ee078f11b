#!/usr/bin/python3
"""test_residual_norm.py: which residual adds the layernorms make, forward and backward
(meson test `codegen-residual-norm`; codegen/emit_residual_norm.c, passes/memory.c's
sum_adds, docs/compiler.md "Memory").

usage: /usr/bin/python3 tests/codegen/test_residual_norm.py DMC SOURCE_ROOT

The counts come from gpt.dm's blocks, not from a run of dmc: each of the L blocks adds two
residuals whose sums a layernorm reads next (x_attn into ln_2, the block's output into the
next block's ln_1 or ln_f), so 2L adds are made by their layernorm's pass; backward, each
of the 2L layernorm input gradients is added to the residual's gradient, so 2L gradients
accumulate in place. The first add (x = wte + wpe) broadcasts wpe and keeps its loop; a
pipeline keeps the forward adds (its stages lay the arena out apart). PyTorch checks the
values (gpt.dm in ref-gpt-pytorch, ref-precision-quality and the spmd suite).

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run


def body(check, dmc, root, tmp):
    gpt = os.path.join(root, "examples/gpt.dm")
    L = 2
    dims = "V=64,T=16,C=32,NH=4,L=%d,B=4" % L
    for label, args in (("serial", []), ("data=2", ["--mesh", "data=2"]), ("bf16", ["--precision", "bf16"])):
        code = generate(dmc, gpt, ["--set", dims] + args, os.path.join(tmp, label), ".c")
        made = re.findall(r"/\* (\w+) = add : [^*]*\*/\n\s*/\* made by (\w+)'s pass, below \*/", code)
        check(len(made) == 2 * L and all(n.endswith("ln_2") or n.endswith("ln_1") or n == "ln_f" for _, n in made),
              "gpt.dm %s: %d residual adds made by their layernorm (%s)" % (label, 2 * L, made))
        check(all(re.search(r"/\* and %s = \w+ \+ \w+ first, row by row, stored \*/" % a, code) for a, _ in made),
              "gpt.dm %s: each layernorm says which add it makes" % label)
        check(re.search(r"\bx\[i0[^]]*\] = wte\[", code) is not None, "gpt.dm %s: x = wte + wpe (a broadcast) keeps its loop" % label)
        accumulated = re.findall(r"/\* the gradient (\w+), added to (\w+) in its buffer: the sum \*/", code)
        check(len(accumulated) == 2 * L, "gpt.dm %s: %d layernorm gradients added into the residual's (%s)"
              % (label, 2 * L, accumulated))
        check(code.count("out_row[j] = out_row[j] + dx;") == 2 * L,
              "gpt.dm %s: their row loops accumulate (out_row[j] = out_row[j] + dx)" % label)
        if label == "bf16":
            copies = [g for g, _ in accumulated
                      if re.search(r"/\* the gradient %s, added to \w+ in its buffer: the sum \*/\n\s*/\* and its bf16 copy"
                                   % g, code)]
            # all but d_x, which only the embedding's f32 gradient reads
            check(len(copies) == 2 * L - 1,
                  "gpt.dm bf16: %d accumulated sums store their bf16 copy in the same pass (%s)" % (2 * L - 1, copies))

    code = generate(dmc, gpt, ["--set", dims, "--mesh", "pipeline=2", "--microbatches", "2"], os.path.join(tmp, "pipe"), ".c")
    check(re.search(r"/\* made by \w+'s pass, below \*/", code) is None,
          "gpt.dm pipeline=2: the forward residual adds keep their loops")

    code = generate(dmc, gpt, ["--set", dims, "--target", "cuda"], os.path.join(tmp, "cuda"), ".cu")
    check(len(re.findall(r"dmrt_gpu_add_layernorm\(ctx->gpu, \w+, \w+, \w+, ", code)) == 2 * L,
          "gpt.dm --target cuda: %d dmrt_gpu_add_layernorm calls" % (2 * L))
    check(len(re.findall(r"dmrt_gpu_layernorm_grad\(ctx->gpu, \w+, \w+, \w+, \w+, 1, NULL, 0,", code)) == 2 * L,
          "gpt.dm --target cuda: %d accumulated layernorm gradients" % (2 * L))
    code = generate(dmc, gpt, ["--set", dims, "--target", "cuda", "--precision", "bf16"], os.path.join(tmp, "cuda16"), ".cu")
    with_copy = re.findall(r"dmrt_gpu_(?:add_)?layernorm(?:_grad)?\(ctx->gpu, [^;]*?, (\w+_bf16), 1, \d+, \d+,", code)
    check(len(with_copy) >= 4 * L, "gpt.dm --target cuda bf16: %d layernorm calls store their bf16 copy (%s)"
          % (len(with_copy), with_copy[:4]))


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-residual-norm-", body))
