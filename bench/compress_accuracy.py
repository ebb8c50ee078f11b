#!/usr/bin/python3
"""compress_accuracy.py: what gradient compression (--compress) costs in accuracy.

usage: /usr/bin/python3 bench/compress_accuracy.py --dmc BUILD/driver/dmc
           [--epochs 5] [--seeds 0[,1,...]] [--modes none,bf16,...] [--backend threads|mpi]
           [--jobs 1]

Trains examples/mlp.dm on Fashion-MNIST with data=2 for each mode (default: none, bf16,
fp16, topk:0.01, topk:0.1, powersgd:8, powersgd:4, powersgd:1) and each seed (the seed
of the initial weights and of the data order, the same for every mode), and prints the
test accuracy after the last epoch next to the uncompressed run's of the same seed, with
the bytes each rank sends per step (--explain=json), each epoch's test accuracy and the
training time (on a shared machine, or with --jobs > 1, the time is noise; the accuracy
is not: a run's result does not depend on its timing). With several seeds, a last table
gives each mode's mean over them. The last epoch's accuracy moves by a point or more
from one run to another that differs only in float rounding (serial against data=2), so
compare means over seeds. --jobs N trains N runs at once. docs/parallelism.md has the
figures.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODES = "none,bf16,fp16,topk:0.01,topk:0.1,powersgd:8,powersgd:4,powersgd:1"


def sent_bytes(dmc, dm_file, mode):
    """(compressed, uncompressed) bytes a rank sends per step for the gradients."""
    cmd = [dmc, "--explain=json", dm_file, "--mesh", "data=2", "--compress", mode]
    out = json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout)
    c = out["compress"]
    return c["sent_bytes_per_rank"], c["uncompressed_sent_bytes_per_rank"]


def train(dmc, dm_file, mode, epochs, seed, backend):
    """(test accuracy at the end, [each epoch's], seconds)"""
    cmd = [dmc, "run", dm_file, "--mesh", "data=2", "--backend", backend, "--epochs", str(epochs), "--seed", str(seed),
           "--quiet"]
    if mode != "none":
        cmd += ["--compress", mode]
    final, per_epoch, _, took = benchlib.train_accuracies(cmd, epochs)
    return final, per_epoch, took


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dmc", required=True)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--modes", default=DEFAULT_MODES)
    ap.add_argument("--backend", default="threads", choices=["threads", "mpi"])
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    dm_file = os.path.join(ROOT, "examples", "mlp.dm")
    modes = a.modes.split(",")
    if "none" not in modes:
        modes.insert(0, "none")
    seeds = [int(x) for x in a.seeds.split(",")]
    sent = {m: sent_bytes(a.dmc, dm_file, m) if m != "none" else None for m in modes}
    plain = next(s[1] for s in sent.values() if s) if len(modes) > 1 else None

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs))
    runs = {(seed, mode): pool.submit(train, a.dmc, dm_file, mode, a.epochs, seed, a.backend)
            for seed in seeds for mode in modes}
    finals = {m: [] for m in modes}
    try:
        for seed in seeds:
            print("examples/mlp.dm on Fashion-MNIST, data=2 (%s), %d epochs, seed %d" % (a.backend, a.epochs, seed))
            print("%-12s %9s %10s %14s %12s %10s  %s" %
                  ("compress", "accuracy", "vs none", "sent/step", "vs none", "time (s)", "each epoch"))
            base = None
            for mode in modes:
                acc, per_epoch, took = runs[(seed, mode)].result()
                finals[mode].append(acc)
                base = acc if mode == "none" else base
                s = sent[mode][0] if sent[mode] else plain
                print("%-12s %9.4f %+10.4f %11.1f KiB %11.1fx %10.1f  %s" %
                      (mode, acc, acc - base, (s or 0) / 1024, plain / s if s else 1.0, took,
                       " ".join("%.4f" % x for x in per_epoch)))
                sys.stdout.flush()
            print()
    except RuntimeError as e:
        for f in runs.values():
            f.cancel()
        sys.exit(str(e))
    if len(seeds) > 1:
        print("mean over seeds %s" % ",".join(str(x) for x in seeds))
        print("%-12s %9s %10s %9s %9s" % ("compress", "mean", "vs none", "lowest", "highest"))
        base = sum(finals["none"]) / len(seeds)
        for mode in modes:
            mean = sum(finals[mode]) / len(seeds)
            print("%-12s %9.4f %+10.4f %9.4f %9.4f" % (mode, mean, mean - base, min(finals[mode]), max(finals[mode])))


if __name__ == "__main__":
    main()
