#!/usr/bin/python3
"""pipeline_bubble.py: the measured pipeline bubble beside the formula (P-1)/(M+P-1).

usage: /usr/bin/python3 bench/pipeline_bubble.py --dmc BUILD/driver/dmc [--steps N]
       [--stages P] [--micro M,M,...] [--schedule gpipe|1f1b|interleaved] [--chunks v]

With --schedule interleaved (--chunks v model chunks per rank, default 2; M a multiple of
P) the formula is (P-1)/(vM+P-1), and the model is cut into P v stages.

Trains tests/spmd/stack.dm (four residual MLP blocks and a head, which dmc cuts into
P balanced stages) at B=256, D=512, H=2048 on --mesh pipeline=P, one BLAS thread per
rank, for each micro-batch count M, with --trace: the trainer gathers every rank's
forward and backward actions and prints the bubble it measured, the idle fraction of
rank-time between the first and the last action of each step (steps 2.. N, the first
warms up), beside the formula of the same P and M. Also prints measured / formula.
Actions wait for their inputs outside the measured span of the action, so a stage that
is slower than the others shows up as idle time on its neighbours: the measured bubble
is the formula's only for balanced stages, and on a machine with at least P cores.
Writes the trace of the last run to /tmp (its path is printed: open it in Perfetto).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
import stio  # noqa: E402

BUBBLE = re.compile(r"pipeline bubble ([0-9.]+) measured over (\d+) steps, formula \(P-1\)/\(v?M\+P-1\) ([0-9.]+)")
SIZES = "B=256,D=512,H=2048,K=8"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dmc", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", default="1,2,4,8,16")
    ap.add_argument("--schedule", default="gpipe")
    ap.add_argument("--chunks", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dmc-bubble-")
    rng = np.random.default_rng(0)
    batches = os.path.join(tmp, "batches.safetensors")
    stio.save({"x": rng.standard_normal((a.steps, 256, 512)).astype(np.float32),
                "y": rng.integers(0, 8, (a.steps, 256)).astype(np.int32)}, batches)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    chunks = ["--chunks", str(a.chunks)] if a.schedule == "interleaved" else []
    print("stack.dm %s, pipeline=%d, %s %s, %d steps; bubble = idle share of rank-time"
          % (SIZES, a.stages, a.schedule, " ".join(chunks), a.steps))
    print("%4s %10s %10s %8s" % ("M", "measured", "formula", "ratio"))
    trace = None
    for m in [int(x) for x in a.micro.split(",")]:
        trace = os.path.join(tmp, "trace-m%d.json" % m)
        cmd = [a.dmc, "run", os.path.join(ROOT, "tests/spmd/stack.dm"), "--set", SIZES, "--mesh", "pipeline=%d" % a.stages,
               "--microbatches", str(m), "--schedule", a.schedule, "--batch-file", batches, "--steps", str(a.steps),
               "--quiet", "--trace", trace] + chunks
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        got = BUBBLE.search(out.stdout)
        if out.returncode != 0 or not got:
            sys.stderr.write("pipeline_bubble: %s failed:\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
            return 1
        measured, formula = float(got.group(1)), float(got.group(3))
        print("%4d %9.1f%% %9.1f%% %8.2f" % (m, 100 * measured, 100 * formula, measured / formula if formula else 0))
    print("last trace: %s (and its .svg)" % trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
