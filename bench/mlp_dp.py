#!/usr/bin/python3
"""mlp_dp.py: data-parallel scaling of examples/mlp.dm on Fashion-MNIST: 1 rank vs 2.

usage: /usr/bin/python3 bench/mlp_dp.py --dmc BUILD/driver/dmc [--steps N] [--runs N]

Runs `dmc run examples/mlp.dm --steps N --quiet` (B=128, the global batch) as:
  serial          one rank on as many threads as ranks below (2): DMC_THREADS (and
                  OPENBLAS_NUM_THREADS, which a runtime built without OpenMP reads)
  serial-1thread  one rank on one thread (the per-rank budget of the runs below)
  threads data=2  two ranks as threads of one process (--mesh data=2), one thread each;
                  its gradients are two buckets, one of 45 KiB started during the backward
                  pass, the other (7 MiB) reduced at its end
  threads 2 MiB   the same with --bucket-mb 2: fc2's gradient (4 MiB) is reduced on a
                  helper thread while fc1's is computed
  mpi data=2      two processes under mpirun (--backend mpi), one BLAS thread each
Times are the trainer's own `trained N steps in T s` (the step loop: batches and
train_step, collectives included; not compiling, data loading or evaluation). Prints ms
per step of each and the speed-up over serial (serial ms / run ms; > 1: faster), best of
--runs alternating runs. Each rank computes half the batch, so the ideal on 2 cores is 2x
over serial-1thread; gradient allreduce (7.1 MiB per step per rank) is the overhead.
The first 5 losses of every run are checked equal to the serial ones within 1e-5
(relative); later ones drift apart as float32 roundings (BLAS threading, sums over ranks)
are amplified by AdamW.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINED = re.compile(r"trained (\d+) steps in ([0-9.]+) s")


def run(dmc, steps, extra, blas_threads):
    # a rank's threads (docs/runtime.md, "Cores"): DMC_THREADS; OpenBLAS's setting is for
    # a runtime built without OpenMP
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas_threads), DMC_THREADS=str(blas_threads), OMP_WAIT_POLICY="PASSIVE")
    cmd = [dmc, "run", os.path.join(ROOT, "examples/mlp.dm"), "--steps", str(steps), "--quiet",
           "--seed", "1"] + extra
    if "--backend" in extra:
        # mpirun passes OPENBLAS_NUM_THREADS on with -x
        cmd += ["--mpirun", "mpirun --oversubscribe -x OPENBLAS_NUM_THREADS -x DMC_THREADS -x OMP_WAIT_POLICY"
                + (" --allow-run-as-root" if os.geteuid() == 0 else "")]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
    if r.returncode != 0:
        sys.exit("bench: `%s` failed:\n%s" % (" ".join(cmd), r.stderr))
    m = TRAINED.search(r.stdout)
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    return 1e3 * float(m.group(2)) / int(m.group(1)), losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dmc", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    opts = ap.parse_args()
    configs = [("serial", [], 2), ("serial-1thread", [], 1), ("threads data=2", ["--mesh", "data=2"], 1),
               # fc2's gradient in a bucket of its own, reduced while fc1's is computed
               ("threads 2 MiB", ["--mesh", "data=2", "--bucket-mb", "2"], 1)]
    if shutil.which("mpirun"):
        configs.append(("mpi data=2", ["--mesh", "data=2", "--backend", "mpi"], 1))
    best, ref_losses = {}, None
    for _ in range(opts.runs):
        for name, extra, blas in configs:
            ms, losses = run(opts.dmc, opts.steps, extra, blas)
            if ref_losses is None:
                ref_losses = losses
            worst = max(abs(a - b) / abs(b) for a, b in zip(losses[:5], ref_losses[:5]))
            if len(losses) != len(ref_losses) or worst > 1e-5:
                sys.exit("bench: %s: losses differ from the serial run (max rel %.3g)" % (name, worst))
            best[name] = min(best.get(name, ms), ms)
    print("mlp.dm data parallel, %d steps of B=128 (best of %d; ms per step)" % (opts.steps, opts.runs))
    for name, _, blas in configs:
        print("  %-16s %8.2f ms  speed-up vs serial %.2fx, vs serial-1thread %.2fx  (BLAS threads per rank %d)"
              % (name, best[name], best["serial"] / best[name], best["serial-1thread"] / best[name], blas))


if __name__ == "__main__":
    main()
