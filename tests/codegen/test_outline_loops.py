#!/usr/bin/python3
"""test_outline_loops.py: each op's loops written once a file and called by every op whose
loops are the same (meson test `codegen-outline-loops`; codegen/outline_loops.c,
docs/compiler.md "Loops written once").

usage: /usr/bin/python3 tests/codegen/test_outline_loops.py DMC SOURCE_ROOT

The oracles:
  - gpt.dm's L blocks are the same ops on buffers of the same shapes, so every op of block
    h.k that calls a helper calls the one block h.0's same op calls, the number of helpers
    does not grow with L, and the calls grow by the same count a block (L = 2, 4, 8);
  - a program whose loops are written in place (DMC_OUTLINE_LOOPS=off, what dmc wrote
    before) trains to the same bits, compiled unoptimised (DMC_CFLAGS=-O0: the same float
    operations in the same order, none vectorised): `dmc run --save` after 3 steps of gpt.dm
    on data=2 x tensor=2 and of llama.dm (RoPE, SwiGLU, RMSNorm: other loops) in bf16, the
    files compared byte for byte; optimised (the run's own flags), the first step's
    gradients (--dump-grads) agree within 1e-5 of each tensor's largest: the compiler may
    vectorise a helper's loop where it left the same loop scalar in a long function (gcc
    -O2 did so for gpt.dm's GELU), and libmvec's vector tanhf rounds apart from libm's
    scalar one (AdamW's first steps, which divide by the gradients' own size, make such
    roundings of near-zero gradients into differences of lr, so weights are no oracle);
  - the CUDA target writes its kernels as before (its dialect dedups kernels itself).

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import subprocess
import sys

import numpy as np

from generated import generate, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402

HELPER = re.compile(r"^static void (\w+_loops_\d+)\(", re.M)
# an op's two comments, then the call of its helper (its leading comments between)
CALL = re.compile(r"/\* (\w+) = (\w+) : [^\n]*\*/\n(?:\s*/\*[^\n]*\*/\n)*\s*(\w+_loops_\d+)\(")


def calls_by_op(code):
    """{(op's name with its block number as k, op kind): set of helpers called}"""
    by_op = {}
    for name, kind, helper in CALL.findall(code):
        key = (re.sub(r"^(d_)?h_\d+_", r"\1h_k_", name), kind)
        by_op.setdefault(key, set()).add(helper)
    return by_op


def train(dmc, model, args, trainer, out, outline, cflags=None):
    """dmc run: 3 steps saved to out (-O0), or one step's gradients dumped to it (optimised)."""
    env = dict(os.environ)
    if not outline:
        env["DMC_OUTLINE_LOOPS"] = "off"
    if cflags is not None:
        env["DMC_CFLAGS"] = cflags
    what = ["--steps", "3", "--save", out] if cflags else ["--steps", "1", "--dump-grads", out]
    done = subprocess.run([dmc, "run", model] + args + ["--"] + trainer + what + ["--quiet"],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
    return done.returncode == 0


def body(check, dmc, root, tmp):
    gpt = os.path.join(root, "examples/gpt.dm")
    helpers, calls = {}, {}
    for L in (2, 4, 8):
        code = generate(dmc, gpt, ["--set", "V=64,T=16,C=32,NH=4,B=4,L=%d" % L], os.path.join(tmp, "gpt%d" % L), ".c",
                        outline=True)
        helpers[L] = HELPER.findall(code)
        calls[L] = len(re.findall(r"^\s+\w+_loops_\d+\(", code, re.M))
        by_op = calls_by_op(code)
        shared = [k for k, h in by_op.items() if k[0].startswith(("h_k_", "d_h_k_"))]
        check(len(shared) > 0 and all(len(by_op[k]) == 1 for k in shared),
              "gpt.dm L=%d: each block's op calls the helper block h.0's same op calls (%d ops, %s)"
              % (L, len(shared), sorted((k, sorted(h)) for k, h in by_op.items() if len(h) > 1)))
        check(len(helpers[L]) == len(set(helpers[L])), "gpt.dm L=%d: each helper written once" % L)
        if L == 4:
            inline = generate(dmc, gpt, ["--set", "V=64,T=16,C=32,NH=4,B=4,L=4"], os.path.join(tmp, "gpt4-inline"), ".c")
            check(not HELPER.search(inline), "DMC_OUTLINE_LOOPS=off: no helper")
            check(code.count("for (") < inline.count("for ("),
                  "the loops written once: %d for statements against %d in place" % (code.count("for ("), inline.count("for (")))
    check(len(helpers[2]) > 0 and len(helpers[4]) == len(helpers[8]) == len(helpers[2]),
          "the helpers do not grow with L (%d, %d, %d)" % (len(helpers[2]), len(helpers[4]), len(helpers[8])))
    check(calls[8] - calls[4] == 2 * (calls[4] - calls[2]) and calls[4] > calls[2],
          "the calls grow by a block's count a block (L=2: %d, 4: %d, 8: %d)" % (calls[2], calls[4], calls[8]))

    cuda = generate(dmc, gpt, ["--set", "V=64,T=16,C=32,NH=4,B=4,L=4", "--target", "cuda"], os.path.join(tmp, "cuda"),
                    ".cu", outline=True)
    check(not HELPER.search(cuda), "--target cuda: no C helper (its dialect reuses its own kernels)")

    text = ["--data", "text:/usr/share/games/fortunes/cookie"]
    cases = [("gpt.dm data=2 x tensor=2", gpt, ["--set", "V=256,T=16,C=32,NH=4,L=3,B=4", "--mesh", "data=2,tensor=2"]),
             ("llama.dm bf16", os.path.join(root, "examples/llama.dm"),
              ["--set", "V=256,T=16,C=32,NH=4,NKV=2,F=48,L=2,B=4", "--precision", "bf16"])]
    for label, model, args in cases:
        for cflags in ("-O0", None):
            saved = {}
            for outline in (True, False):
                saved[outline] = os.path.join(tmp, "%s-%s-%d.safetensors" % (re.sub(r"\W+", "-", label), cflags, outline))
                check(train(dmc, model, args, text, saved[outline], outline, cflags),
                      "%s %s: dmc run trains (%s)" % (label, cflags or "optimised",
                                                              "loops written once" if outline else "loops in place"))
            if not all(os.path.exists(p) for p in saved.values()):
                continue
            if cflags:
                check(open(saved[True], "rb").read() == open(saved[False], "rb").read(),
                      "%s -O0: the weights after 3 steps are the same bits with the loops written once and in place"
                      % label)
            else:
                a, b = stio.load(saved[True]), stio.load(saved[False])
                worst = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30)) for k in b)
                check(a.keys() == b.keys() and len(b) > 0 and worst <= 1e-5,
                      "%s optimised: the first step's gradients agree within 1e-5 of each tensor's largest (%.3g)"
                      % (label, worst))


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-outline-", body))
