#!/usr/bin/python3
"""sequence_parallel.py: examples/gpt.dm on tensor parallelism alone and with
--sequence-parallel, the same model, batches and initial weights: step time and memory.

usage: /usr/bin/python3 bench/sequence_parallel.py --dmc BUILD/driver/dmc [--mesh tensor=2]
           [--set V=256,T=256,C=256,NH=8,L=4,B=8] [--steps 8] [--runs 3] [--dmc-arg=ARG ...]

Each run trains --steps steps (after 2 warm-up steps, not counted) with the threads backend
and one BLAS thread per rank (OPENBLAS_NUM_THREADS=1), on random tokens (numpy, seed 0) in
a batch file; the two plans alternate --runs times and the best median of each is
reported (use it on a busy machine). Per plan it prints: ms/step (the trainer's `ms`
field), the predicted step of `--explain=json` (the nominal hardware unless a --dmc-arg
--hardware says otherwise), the bytes each rank sends per step, the planned activation
arena and peak, the measured peak (`dmc run --memory`, the largest rank's model
allocations), and the losses' largest relative difference between the plans.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
WARMUP = 2


def explain(dmc, sizes, mesh, extra):
    r = subprocess.run([dmc, "--explain=json", os.path.join(ROOT, "examples", "gpt.dm"), "--set", sizes, "--mesh", mesh]
                       + extra, stdout=subprocess.PIPE, universal_newlines=True, check=True)
    return json.loads(r.stdout)


def train(dmc, sizes, mesh, extra, batch_file, steps, tmp):
    """(median ms/step after the warm-up, losses, the largest rank's measured peak)."""
    cmd = [dmc, "run", os.path.join(ROOT, "examples", "gpt.dm"), "--set", sizes, "--mesh", mesh,
           "--batch-file", batch_file, "--steps", str(steps + WARMUP), "--seed", "1", "--quiet", "--memory"] + extra
    env = dict(os.environ, TMPDIR=tmp, OPENBLAS_NUM_THREADS="1")
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    fields = []
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step" and f[2] == "loss":
            fields.append({name: float(value) for name, value in zip(f[2::2], f[3::2])})
    peaks = [int(line.split()[5]) for line in r.stderr.splitlines() if line.startswith("memory rank")]
    return statistics.median(f["ms"] for f in fields[WARMUP:]), [f["loss"] for f in fields], max(peaks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmc", default=os.path.join(ROOT, "build", "driver", "dmc"))
    ap.add_argument("--mesh", default="tensor=2")
    ap.add_argument("--set", dest="sizes", default="V=256,T=256,C=256,NH=8,L=4,B=8")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dmc-arg", action="append", default=[])
    args = ap.parse_args()
    import numpy as np
    import stio
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(","))}
    plans = [("tensor parallel", list(args.dmc_arg)), ("+ sequence parallel", ["--sequence-parallel"] + args.dmc_arg)]
    best = {name: None for name, _ in plans}
    with tempfile.TemporaryDirectory(prefix="dmc-bench-seqpar-") as tmp:
        rng = np.random.default_rng(0)
        batch_file = os.path.join(tmp, "batch.safetensors")
        shape = (args.steps + WARMUP, dims["B"], dims["T"])
        stio.save({"tokens": rng.integers(0, dims["V"], shape).astype(np.int32),
                   "targets": rng.integers(0, dims["V"], shape).astype(np.int32)}, batch_file)
        for _ in range(args.runs):
            for name, extra in plans:
                ms, losses, peak = train(args.dmc, args.sizes, args.mesh, extra, batch_file, args.steps, tmp)
                if best[name] is None or ms < best[name][0]:
                    best[name] = (ms, losses, peak)
    print("gpt.dm --set %s --mesh %s, threads backend, 1 BLAS thread per rank, best of %d runs of %d steps"
          % (args.sizes, args.mesh, args.runs, args.steps))
    print("%-22s %9s %12s %12s %14s %14s %14s" % ("plan", "ms/step", "predicted ms", "sent/rank", "activations",
                                                  "planned peak", "measured peak"))
    for name, extra in plans:
        e = explain(args.dmc, args.sizes, args.mesh, extra)
        m = e["memory_bytes_per_rank"]
        ms, _, peak = best[name]
        print("%-22s %9.1f %12.2f %12d %14d %14d %14d" % (name, ms, 1e3 * e["predicted"]["step_seconds"],
                                                      e["communication"]["sent_bytes_per_rank"], m["activations"],
                                                      m["peak_bytes_per_rank"], peak))
    a, b = best[plans[0][0]][1], best[plans[1][0]][1]
    print("losses: largest relative difference %.1e over %d steps" % (max(abs(x - y) / abs(x) for x, y in zip(a, b)), len(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
