#!/usr/bin/python3
"""test_off_loss.py DMC SOURCE_ROOT: a parameter read off the loss path on an earlier stage.

tests/pipeline/off_loss.dm reads w in `dead = x @ w`, an output that does not reach the
loss, before `z = h @ w` on the loss path. The cut puts `dead` on stage 0 and z on stage 1;
w's gradient is made on stage 1 (the last contribution autodiff adds is z's), so stage 1
holds w, sums its gradient and updates it, and stage 0 holds a copy it receives after each
update. Before, w lived on its first reader's stage (0), whose update read a gradient that
only stage 1 held: `dmc -o` aborted ("internal error: 'w.grad' is used on stage 0, which
holds no copy of it"). Checks:
  - --explain=json: w tied on stages 0 and 1, updated by stage 1;
  - `dmc run` on pipeline=2 (1 and 2 micro-batches), 1F1B, interleaved (2 chunks),
    pipeline=4 and data=2 x pipeline=2 (with ZeRO 3) trains to the serial program's weights
    (1e-6), and 2bw to the weights of 2bw on the program without `dead` (exactly: `dead`
    changes nothing the loss reads);
  - --predict on pipeline=2 from the trained weights: `dead` is x @ w (numpy, 1e-5), read
    from stage 0's copy;
  - the pipedream schedule refuses it with a located error (tests/diag has the golden).
Exit status: 0 pass, 1 failure.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
import trained  # noqa: E402
from trained import dmc_run, worst  # noqa: E402

STEPS = 6
WEIGHT_ATOL = 1e-6
MESHES = [["--mesh", "pipeline=2"],
          ["--mesh", "pipeline=2", "--microbatches", "2"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"],
          ["--mesh", "pipeline=2", "--microbatches", "2", "--schedule", "interleaved", "--chunks", "2"],
          ["--mesh", "pipeline=4", "--microbatches", "4"],
          ["--mesh", "data=2,pipeline=2", "--microbatches", "2", "--zero", "3"]]


def train(dmc, dm, tmp, batch_file, tag, args):
    return trained.train(dmc, dm, tmp, batch_file, tag, args, STEPS)


def main(argv):
    dmc, root = os.path.abspath(argv[1]), argv[2]
    dm = os.path.join(os.path.abspath(root), "tests", "pipeline", "off_loss.dm")
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-offloss-") as tmp:
        def case(what, fn):
            trained.checked(failures, what, fn)

        def explain():
            p = subprocess.run([dmc, "--explain=json", "--mesh", "pipeline=2", dm], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            if p.returncode != 0:
                raise AssertionError("exit %d\n%s" % (p.returncode, p.stderr))
            tied = json.loads(p.stdout)["pipeline"]["tied"]
            print("explain: tied %s" % tied)
            if tied != [{"name": "w", "updated_on": 1, "stages": [0, 1]}]:
                raise AssertionError("w is not tied on stages 0 and 1, updated by 1: %s" % tied)
            out = os.path.join(tmp, "gen")
            p = subprocess.run([dmc, "-o", out, "--mesh", "pipeline=2", dm], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            if p.returncode != 0:
                raise AssertionError("dmc -o: exit %d\n%s" % (p.returncode, p.stderr))
            code = open(os.path.join(out, "off_loss.c")).read()
            if "w is tied across stages: stage 1 updates it" not in code:
                raise AssertionError("the generated code does not send w from stage 1")

        case("explain", explain)
        rng = np.random.default_rng(3)
        x = rng.standard_normal((STEPS, 8, 8)).astype(np.float32)
        batch_file = os.path.join(tmp, "batches.safetensors")
        stio.save({"x": x}, batch_file)
        serial = train(dmc, dm, tmp, batch_file, "serial", [])
        initial = train(dmc, dm, tmp, batch_file, "initial", ["--steps", "0"])
        moved = worst(serial, initial)
        print("serial: the weights moved %.3g from their initial values" % moved)
        if not moved > 1e-3:
            failures.append("serial training moved nothing")
        for args in MESHES:
            tag = "_".join(args).replace("-", "").replace("=", "").replace(",", "_")

            def mesh(args=args, tag=tag):
                err = worst(train(dmc, dm, tmp, batch_file, tag, args), serial)
                print("%-60s weights %.1e (bound %.0e)" % (" ".join(args), err, WEIGHT_ATOL))
                if err > WEIGHT_ATOL:
                    raise AssertionError("the weights differ from the serial run's by %.3g" % err)
            case(" ".join(args), mesh)

        def two_bw():
            # the same program without `dead`: w on one stage
            plain = os.path.join(tmp, "plain.dm")
            with open(plain, "w") as f:
                f.write("".join(line for line in open(dm) if not line.startswith(("dead", "output"))))
            args = ["--mesh", "pipeline=2", "--microbatches", "2", "--schedule", "2bw"]
            err = worst(train(dmc, dm, tmp, batch_file, "2bw", args), train(dmc, plain, tmp, batch_file, "2bw-plain", args))
            print("2bw against 2bw without dead: weights %.1e (bound 0)" % err)
            if err != 0:
                raise AssertionError("the weights differ by %.3g" % err)
        case("2bw", two_bw)

        def predict():
            weights = os.path.join(tmp, "w-mesh_pipeline2_microbatches_2.safetensors")
            if not os.path.exists(weights):
                raise AssertionError("no trained weights")
            rows = os.path.join(tmp, "rows.safetensors")
            stio.save({"x": x[0]}, rows)
            out = os.path.join(tmp, "out.safetensors")
            dmc_run(dmc, dm, tmp, ["--predict", "--init", weights, "--batch-file", rows, "--out", out, "--mesh", "pipeline=2"])
            got = stio.load(out)["dead"]
            err = float(np.max(np.abs(got - x[0] @ stio.load(weights)["w"])))
            print("predict on pipeline=2: dead against x @ w %.1e (bound 1e-5)" % err)
            if err > 1e-5:
                raise AssertionError("dead differs from x @ w by %.3g" % err)
        case("predict", predict)

        def pipedream():
            p = subprocess.run([dmc, "--check", "--mesh", "pipeline=2", "--microbatches", "2", "--schedule", "pipedream", dm],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
            if p.returncode != 1 or "off_loss.dm:9:10: error: 'w' is read here on pipeline stage 0" not in p.stderr:
                raise AssertionError("exit %d, expected 1 and the error at dead:\n%s" % (p.returncode, p.stderr))
        case("pipedream", pipedream)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
