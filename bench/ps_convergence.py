#!/usr/bin/python3
"""ps_convergence.py: what asynchronous parameter servers (--ps-staleness) cost in accuracy.

usage: /usr/bin/python3 bench/ps_convergence.py --dmc BUILD/driver/dmc
           [--epochs 3] [--seeds 0[,1,...]] [--workers 4] [--servers 2]
           [--modes allreduce,sync,0,1,4] [--backend threads|mpi] [--optimizer LINE]

Trains examples/mlp.dm on Fashion-MNIST on data=W for each mode: plain allreduce data
parallelism, synchronous parameter servers (the allreduce's weights byte for byte, so the
same accuracy), and asynchronous servers with each staleness bound given; each seed (of the
initial weights and the data order) is the same for every mode. Prints each run's test
accuracy after every epoch and its difference from the allreduce run of the same seed, the
servers' report (updates, how far apart the workers ran), and the wall time (on a shared
machine the time is noise; the synchronous accuracies are not: they do not depend on
timing, while the asynchronous ones do, which is the point: run several seeds).
--optimizer replaces mlp.dm's optimizer line (e.g. "optimizer sgd(lr = 0.05, momentum =
0.9)"). docs/parallelism.md ("Parameter servers") has the figures.
"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def train(dmc, dm_file, mode, args, seed):
    """(final accuracy, [each epoch's], the servers' lines, seconds)"""
    cmd = [dmc, "run", dm_file, "--mesh", "data=%d" % args.workers, "--backend", args.backend, "--epochs",
           str(args.epochs), "--seed", str(seed), "--quiet"]
    if mode != "allreduce":
        cmd += ["--param-servers", str(args.servers)]
    if mode not in ("allreduce", "sync"):
        cmd += ["--ps-staleness", mode]
    final, per_epoch, out, took = benchlib.train_accuracies(cmd, args.epochs)
    return final, per_epoch, re.findall(r"^server \d+ .*$", out, re.M), took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dmc", default=os.path.join(ROOT, "build", "driver", "dmc"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--modes", default="allreduce,sync,0,1,4")
    ap.add_argument("--backend", default="threads", choices=["threads", "mpi"])
    ap.add_argument("--optimizer", default=None)
    args = ap.parse_args()
    dm_file = os.path.join(ROOT, "examples", "mlp.dm")
    tmp = None
    if args.optimizer:
        tmp = tempfile.TemporaryDirectory(prefix="ps-convergence-")
        with open(dm_file) as f:
            src = re.sub(r"^optimizer .*$", args.optimizer, f.read(), flags=re.M)
        dm_file = os.path.join(tmp.name, "mlp.dm")
        with open(dm_file, "w") as f:
            f.write(src)
    modes = args.modes.split(",")
    print("examples/mlp.dm on Fashion-MNIST, data=%d, %d servers, %d epochs, %s backend%s" %
          (args.workers, args.servers, args.epochs, args.backend,
           ", " + args.optimizer if args.optimizer else ""))
    print("%-10s %5s %9s %9s  %-28s %8s  %s" % ("mode", "seed", "accuracy", "vs allr.", "per epoch", "seconds",
                                                 "servers"))
    for seed in [int(s) for s in args.seeds.split(",")]:
        base = None
        for mode in modes:
            acc, per_epoch, servers, took = train(args.dmc, dm_file, mode, args, seed)
            if mode == "allreduce":
                base = acc
            label = mode if mode in ("allreduce", "sync") else "async K=%s" % mode
            delta = "%+.4f" % (acc - base) if base is not None else "-"
            apart = sorted(set(re.findall(r"at most (\d+) steps apart", " ".join(servers))))
            print("%-10s %5d %9.4f %9s  %-28s %8.1f  %s" % (label, seed, acc, delta,
                                                          " ".join("%.4f" % a for a in per_epoch), took,
                                                          ("workers at most %s steps apart" % "/".join(apart)) if apart
                                                          else ("synchronous" if servers else "")))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
