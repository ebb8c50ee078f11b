#!/usr/bin/env python3
"""memory_largest_gpt.py: the deepest GPT (layers L at a fixed width) that trains within a
memory limit per rank on 8 ranks, for each memory technique and some combinations.

For each plan, a binary search over L asks `dmc --explain=json` for the largest rank's
predicted peak (memory.peak_bytes_per_rank: parameters, gradients, optimizer state,
activations in flight, gradient sums, scratch, outputs); tests/spmd/test_memory.py and
test_recompute.py hold that prediction equal to what the ranks allocate. With --verify,
the deepest model of each plan trains one step on 8 thread ranks (`dmc run --memory`) and
the measured peak of every rank is printed next to the limit.

    python3 bench/memory_largest_gpt.py [--dmc build/driver/dmc] [--limit-mib 128] [--verify]
        [--plans tensor]   (only the plans whose name has it, after data parallel)

Prints one row per plan and its ratio of layers to plain data parallelism's.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# width and sequence fixed; the global batch splits over data and into micro-batches
SIZES = "V=2048,T=128,C=256,NH=8,B=16"
PLANS = [
    ("data parallel", ["--mesh", "data=8"]),
    ("ZeRO 1", ["--mesh", "data=8", "--zero", "1"]),
    ("ZeRO 2", ["--mesh", "data=8", "--zero", "2"]),
    # zero 2 assembles a whole bucket in scratch: smaller buckets, less scratch
    ("ZeRO 2, 1 MiB buckets", ["--mesh", "data=8", "--zero", "2", "--bucket-mb", "1"]),
    # zero 3: parameters in shares too, each bucket gathered whole while its layer runs
    ("ZeRO 3, 1 MiB buckets", ["--mesh", "data=8", "--zero", "3", "--bucket-mb", "1"]),
    ("ZeRO 3 + recompute, 1 MiB buckets", ["--mesh", "data=8", "--zero", "3", "--bucket-mb", "1", "--recompute", "full"]),
    ("recompute full", ["--mesh", "data=8", "--recompute", "full"]),
    ("recompute selective", ["--mesh", "data=8", "--recompute", "selective"]),
    ("ZeRO 2 + recompute", ["--mesh", "data=8", "--zero", "2", "--recompute", "full"]),
    ("tensor=8", ["--mesh", "tensor=8"]),
    ("data=2 x tensor=4", ["--mesh", "data=2,tensor=4"]),
    # the residual stream's rows split over tensor between its products
    ("tensor=8 + sequence parallel", ["--mesh", "tensor=8", "--sequence-parallel"]),
    ("data=2 x tensor=4 + sequence parallel", ["--mesh", "data=2,tensor=4", "--sequence-parallel"]),
    ("pipeline=8 (1F1B, 8 micro)", ["--mesh", "pipeline=8", "--microbatches", "8", "--schedule", "1f1b"]),
    ("data=2 x pipeline=4 (1F1B)", ["--mesh", "data=2,pipeline=4", "--microbatches", "8", "--schedule", "1f1b"]),
    ("d2 x t2 x p2 + ZeRO 2 + recompute", ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4", "--schedule",
                                          "1f1b", "--zero", "2", "--recompute", "full"]),
]


def peak(dmc, layers, extra):
    """The largest rank's predicted peak in bytes, or None when the plan does not compile."""
    r = subprocess.run([dmc, "--explain=json", os.path.join(ROOT, "examples/gpt.dm"), "--set",
                        "%s,L=%d" % (SIZES, layers)] + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)["memory_bytes_per_rank"]["peak_bytes_per_rank"]


def deepest(dmc, limit, extra):
    lo, hi = 0, 1
    while True:
        p = peak(dmc, hi, extra)
        if p is not None and p > limit:
            break
        if p is not None:
            lo = hi
        hi *= 2
        if hi > 4096:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p = peak(dmc, mid, extra)
        if p is not None and p <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def measured(dmc, layers, extra, tmp):
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
    import stio
    dims = dict(kv.split("=") for kv in SIZES.split(","))
    b, t, v = int(dims["B"]), int(dims["T"]), int(dims["V"])
    rng = np.random.default_rng(0)
    bf = os.path.join(tmp, "batch.safetensors")
    stio.save({"tokens": rng.integers(0, v, (1, b, t)).astype(np.int32),
               "targets": rng.integers(0, v, (1, b, t)).astype(np.int32)}, bf)
    r = subprocess.run([dmc, "run", os.path.join(ROOT, "examples/gpt.dm"), "--set", "%s,L=%d" % (SIZES, layers),
                        "--batch-file", bf, "--steps", "1", "--quiet", "--memory"] + extra, cwd=tmp,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(os.environ, TMPDIR=tmp))
    peaks = [int(x) for x in re.findall(r"^memory rank \d+: model peak (\d+) bytes", r.stderr, re.M)]
    return max(peaks) if peaks and r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmc", default=os.path.join(ROOT, "build", "driver", "dmc"))
    ap.add_argument("--limit-mib", type=float, default=128.0)
    ap.add_argument("--verify", action="store_true", help="train each deepest model one step and measure it")
    ap.add_argument("--plans", help="only the plans whose name contains this (data parallel, the ratios' base, always)")
    args = ap.parse_args()
    limit = int(args.limit_mib * 1024 * 1024)
    print("GPT %s, 8 ranks, at most %.0f MiB per rank (predicted peak of the largest rank)" % (SIZES, args.limit_mib))
    base = None
    with tempfile.TemporaryDirectory(prefix="dmc-bench-memory-") as tmp:
        for name, extra in PLANS:
            if args.plans and base is not None and args.plans not in name:
                continue
            layers = deepest(args.dmc, limit, extra)
            if base is None:
                base = max(layers, 1)
            p = peak(args.dmc, layers, extra) if layers else None
            line = "%-36s L = %4d  (%.2fx data parallel)  predicted peak %s" % (
                name, layers, layers / base, "%.1f MiB" % (p / 2**20) if p else "-")
            if args.verify and layers:
                m = measured(args.dmc, layers, extra, tmp)
                line += ", measured %s" % ("%.1f MiB" % (m / 2**20) if m else "failed")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
