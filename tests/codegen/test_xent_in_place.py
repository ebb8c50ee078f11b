#!/usr/bin/python3
"""test_xent_in_place.py: which cross-entropy gradients are written over their logits
(meson test `codegen-xent-in-place`; passes/memory.c's xent_grad_over_logits,
docs/compiler.md "Memory").

usage: /usr/bin/python3 tests/codegen/test_xent_in_place.py DMC SOURCE_ROOT

The rule, not a run of dmc, says which: the gradient takes the logits' buffer where nothing
reads the logits after it. tests/spmd/clip.dm declares no outputs, so its logits die at
the gradient: on both targets, serial and data=2 (and in bf16, where the gradient stays f32
because b3's gradient sums it), d_logits is declared at the logits' place. gpt.dm declares
`output logits` (readable after a step): its gradient keeps a buffer of its own. A pipeline
with micro-batches keeps its own too. The values are checked by every PyTorch oracle and
spmd test of the models without outputs (clip, gated, rope, sgd, tests/ref's attention and
2bw models), whose programs now run so; the spmd memory test checks the measured peak.

Exit status: 0 pass, 1 failure, 2 usage.
"""
import os
import re
import sys

from generated import generate, run


def places(code):
    """{name: 'region + offset'} of every buffer declared in the backward pass."""
    back = code[code.index("static int run_backward"):] if "static int run_backward" in code else code
    return dict(re.findall(r"float \*(\w+) = (ctx->\w+ \+ \d+|\(float \*\)\(ctx->\w+ \+ \d+\)|[^;]+);", back))


def body(check, dmc, root, tmp):
    clip = os.path.join(root, "tests/spmd/clip.dm")
    gpt = os.path.join(root, "examples/gpt.dm")
    for label, args, ext in (("serial", [], ".c"), ("data=2", ["--mesh", "data=2"], ".c"),
                             ("bf16", ["--precision", "bf16"], ".c"), ("cuda", ["--target", "cuda"], ".cu")):
        code = generate(dmc, clip, args, os.path.join(tmp, label.replace("=", "")), ext)
        p = places(code)
        check(p.get("d_logits") is not None and p.get("d_logits") == p.get("logits"),
              "clip.dm %s: d_logits written over logits (%s, %s)" % (label, p.get("d_logits"), p.get("logits")))
        check("/* written over logits, which nothing reads after it" in code, "clip.dm %s: the gradient says so" % label)

    code = generate(dmc, clip, ["--mesh", "pipeline=2", "--microbatches", "2"], os.path.join(tmp, "pipe"), ".c")
    check("written over logits" not in code, "clip.dm pipeline=2 x 2 micro-batches: d_logits keeps its own buffer")

    code = generate(dmc, gpt, ["--set", "V=64,T=16,C=32,NH=4,L=2,B=4"], os.path.join(tmp, "gpt"), ".c")
    p = places(code)
    check("written over logits" not in code and p.get("d_logits") != p.get("logits"),
          "gpt.dm (output logits): d_logits keeps its own buffer (%s, %s)" % (p.get("d_logits"), p.get("logits")))


if __name__ == "__main__":
    sys.exit(run(sys.argv, __doc__, "dmc-xent-in-place-", body))
