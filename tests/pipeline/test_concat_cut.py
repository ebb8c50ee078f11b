#!/usr/bin/python3
"""test_concat_cut.py DMC SOURCE_ROOT: a concat on a later stage than what it joins.

tests/pipeline/concat_cut.dm cuts after z (cuts = [z]): `logits = concat(z, z)` and
`sc = concat(s, s)` (s = softmax(w1), made from a parameter alone) run on stage 1, while z
and s are made on stage 0. A concat lowers to pads whose windows tile it, and the memory
plan has those pads write straight into the concat's buffer (passes/memory_windows.c).
pipeline_plan_readers skipped every value in another value's buffer as if it were a view
running no code, so the pads' reads of z and s were never counted: neither was sent, and
`dmc -o` aborted ("internal error: 'v5' is used on stage 1, which holds no copy of it";
fuzz cases rc-6_bd70f6ff and rc-6_94e798b2, the second found with 2bw and --recompute
full but failing on every schedule). Checks:
  - `dmc -o` on pipeline=2 compiles, stage 0 sends z and s to stage 1;
  - `dmc run` on pipeline=2 (1 and 2 micro-batches), 1F1B with and without --recompute full
    and data=2 x pipeline=2 trains to the serial program's weights (1e-6);
  - 2bw (and 2bw with --recompute full) to the weights of 2bw on the same program cut after
    sc, where no concat is split from its operands (1e-6): the 2bw rule does not depend on
    the cut. 2bw's weights differ from serial training's by far more, so the check means
    something.
Exit status: 0 pass, 1 failure.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
import trained  # noqa: E402
from trained import dmc_run, worst  # noqa: E402

STEPS = 4
WEIGHT_ATOL = 1e-6
MESHES = [["--mesh", "pipeline=2", "--microbatches", "1"],
          ["--mesh", "pipeline=2"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b", "--recompute", "full"],
          ["--mesh", "data=2,pipeline=2"]]
TWO_BW = [["--mesh", "pipeline=2", "--microbatches", "2", "--schedule", "2bw"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw", "--recompute", "full"]]


def train(dmc, dm, tmp, batch_file, tag, args):
    return trained.train(dmc, dm, tmp, batch_file, tag, args, STEPS)


def tag_of(args):
    return "_".join(args).replace("-", "").replace("=", "").replace(",", "_")


def main(argv):
    dmc, root = os.path.abspath(argv[1]), argv[2]
    dm = os.path.join(os.path.abspath(root), "tests", "pipeline", "concat_cut.dm")
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-concatcut-") as tmp:
        def case(what, fn):
            trained.checked(failures, what, fn)

        def compile_sends():
            out = os.path.join(tmp, "gen")
            p = subprocess.run([dmc, "-o", out, "--mesh", "pipeline=2", dm], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            if p.returncode != 0:
                raise AssertionError("dmc -o: exit %d\n%s" % (p.returncode, p.stderr))
            code = open(os.path.join(out, "concat_cut.c")).read()
            for name in ("z", "s"):
                if '"activation of %s to stage 1 ' % name not in code:
                    raise AssertionError("stage 0 does not send %s to stage 1" % name)
            print("dmc -o: stage 0 sends z and s to stage 1")
        case("dmc -o", compile_sends)

        rng = np.random.default_rng(1)
        batch_file = os.path.join(tmp, "batches.safetensors")
        stio.save({"x": rng.standard_normal((STEPS, 8, 4, 8)).astype(np.float32),
                   "y": rng.integers(0, 4, (STEPS, 8, 4)).astype(np.int32)}, batch_file)
        serial = train(dmc, dm, tmp, batch_file, "serial", [])
        initial = train(dmc, dm, tmp, batch_file, "initial", ["--steps", "0"])
        moved = worst(serial, initial)
        print("serial: the weights moved %.3g from their initial values" % moved)
        if not moved > 1e-2:
            failures.append("serial training moved nothing")
        for args in MESHES:
            def mesh(args=args):
                err = worst(train(dmc, dm, tmp, batch_file, tag_of(args), args), serial)
                print("%-70s weights %.1e (bound %.0e)" % (" ".join(args), err, WEIGHT_ATOL))
                if err > WEIGHT_ATOL:
                    raise AssertionError("the weights differ from the serial run's by %.3g" % err)
            case(" ".join(args), mesh)

        # the same program cut after sc: stage 1 holds the loss alone, no concat split
        ref_dm = os.path.join(tmp, "ref_cut.dm")
        with open(ref_dm, "w") as f:
            f.write(open(dm).read().replace("cuts = [z]", "cuts = [sc]"))
        for args in TWO_BW:
            def two_bw(args=args):
                got = train(dmc, dm, tmp, batch_file, tag_of(args), args)
                want = train(dmc, ref_dm, tmp, batch_file, "ref" + tag_of(args), args)
                err, apart = worst(got, want), worst(got, serial)
                print("%-70s weights %.1e against the cut after sc (bound %.0e; %.3g from serial)" %
                      (" ".join(args), err, WEIGHT_ATOL, apart))
                if err > WEIGHT_ATOL:
                    raise AssertionError("the weights differ from the cut after sc's by %.3g" % err)
                if not apart > 100 * WEIGHT_ATOL:
                    raise AssertionError("2bw ends %.3g from serial training: the check cannot tell them apart" % apart)
            case(" ".join(args), two_bw)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
