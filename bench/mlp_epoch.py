#!/usr/bin/python3
"""mlp_epoch.py: one epoch of examples/mlp.dm on Fashion-MNIST, dmc vs PyTorch (CPU).

usage: /usr/bin/python3 bench/mlp_epoch.py --dmc BUILD/driver/dmc [--threads N] [--runs N]

dmc:     `dmc run examples/mlp.dm --epochs 1 --quiet`. Compile time (dmc + cc) is timed
         apart, by `dmc run examples/mlp.dm --help` (compiles, builds, and the trainer
         only prints its usage); the training time is the trainer's own
         `trained N steps in T s` (the step loop: filling batches and train_step; not
         data loading, compiling or evaluation).
PyTorch: the same model (the input standardisation `xn = (x - MEAN) / STD` read from the
         .dm file when it has one, 784-1024-1024-10, ReLU, weights xavier-uniform,
         biases zero),
         B=128, AdamW(lr=1e-3, weight_decay=1e-4), one shuffled pass of floor(60000/128)
         = 468 batches (last partial batch dropped, as dmc does), data loaded from the
         same gzipped IDX files with gzip+numpy; only the training loop is timed
         (batch gather, forward, backward, optimizer step).
Threads: OPENBLAS_NUM_THREADS (default: the CPUs this process may use), set for both
         (and DMC_THREADS to the same number for dmc, whose loops and one-thread BLAS calls
         it splits over that many threads)
         before torch is imported (Debian's torch uses the same OpenBLAS), and
         torch.set_num_threads to the same number; OMP_WAIT_POLICY=PASSIVE unless set
         (see main).

Prints both times, the ratio pytorch_time / dmc_time (> 1: dmc is faster) and the test
accuracy of both after the epoch. With --runs N, the two sides run alternately N times
each and the best time of each is reported (use it on a busy machine).
"""
import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, D, H, K = 128, 784, 1024, 10


_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
NORM_RE = re.compile(r"^xn\s*=\s*\(\s*x\s*-\s*%s\s*\)\s*/\s*%s\s*(?:#.*)?$" % (_NUM, _NUM), re.M)


def model_norm(path):
    """(mean, std) of the model's input standardisation, or None."""
    with open(path) as f:
        src = f.read()
    m = NORM_RE.search(src)
    uses = re.search(r"^h1\s*=\s*relu\(fc1\((\w+)\)\)", src, re.M)
    if not uses or uses.group(1) != ("xn" if m else "x"):
        sys.exit("mlp_epoch: %s is not the model mirrored here (h1 = relu(fc1(x or xn))); "
                 "update bench/mlp_epoch.py" % path)
    return (float(m.group(1)), float(m.group(2))) if m else None


def read_idx(path, np):
    with gzip.open(path, "rb") as f:
        buf = f.read()
    ndim = buf[3]
    shape = [int.from_bytes(buf[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(buf, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def run_dmc(args, env):
    """Returns (compile_s, train_s, steps, accuracy, wall_s)."""
    with tempfile.TemporaryDirectory(prefix="dmc-bench-") as tmp:
        env = dict(env, TMPDIR=tmp)
        t0 = time.perf_counter()
        r = subprocess.run([args.dmc, "run", args.model, "--help"], env=env, cwd=tmp,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
        compile_s = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit("mlp_epoch: `dmc run %s --help` failed (%d):\n%s" % (args.model, r.returncode, r.stderr))
        cmd = [args.dmc, "run", args.model, "--epochs", "1", "--quiet", "--data-dir", args.data_dir,
               "--seed", str(args.seed)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True)
        wall_s = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit("mlp_epoch: `%s` failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    m = re.search(r"^trained (\d+) steps in ([0-9.]+) s", r.stdout, re.M)
    acc = re.findall(r"^test accuracy ([0-9.]+)", r.stdout, re.M)
    if not m or not acc:
        sys.exit("mlp_epoch: cannot parse dmc's output:\n%s" % r.stdout[-2000:])
    return compile_s, float(m.group(2)), int(m.group(1)), float(acc[-1]), wall_s


def run_torch(args, np, torch):
    """Returns (train_s, steps, accuracy, load_s)."""
    import torch.nn as nn
    import torch.nn.functional as F
    t0 = time.perf_counter()
    d = args.data_dir
    xtr = torch.from_numpy(read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"), np)
                           .reshape(-1, D).astype(np.float32) / 255.0)
    ytr = torch.from_numpy(read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"), np).astype(np.int64))
    xte = torch.from_numpy(read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"), np)
                           .reshape(-1, D).astype(np.float32) / 255.0)
    yte = torch.from_numpy(read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), np).astype(np.int64))
    load_s = time.perf_counter() - t0

    class Standardize(nn.Module):
        def __init__(self, mean, std):
            super().__init__()
            self.mean, self.std = mean, std

        def forward(self, x):
            return (x - self.mean) / self.std

    torch.manual_seed(args.seed)
    layers = [nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, K)]
    if args.norm:
        layers.insert(0, Standardize(*args.norm))
    model = nn.Sequential(*layers)
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    steps = xtr.shape[0] // B
    perm = torch.from_numpy(np.random.default_rng(args.seed).permutation(xtr.shape[0]))

    t0 = time.perf_counter()
    for i in range(steps):
        idx = perm[i * B:(i + 1) * B]
        xb, yb = xtr[idx], ytr[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    train_s = time.perf_counter() - t0

    with torch.no_grad():
        correct = sum(int((model(xte[i:i + B]).argmax(1) == yte[i:i + B]).sum())
                      for i in range(0, xte.shape[0], B))
    return train_s, steps, correct / xte.shape[0], load_s


def main():
    ap = argparse.ArgumentParser(description="one epoch of examples/mlp.dm: dmc vs PyTorch CPU")
    ap.add_argument("--dmc", required=True, help="the dmc executable (BUILD/driver/dmc)")
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "mlp.dm"))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both (default: OPENBLAS_NUM_THREADS, else the usable CPUs)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each side; the best time is reported")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.dmc = os.path.abspath(args.dmc)
    args.model = os.path.abspath(args.model)
    args.norm = model_norm(args.model)

    threads = args.threads or int(os.environ.get("OPENBLAS_NUM_THREADS") or 0) \
        or len(os.sched_getaffinity(0))
    # before torch loads OpenBLAS, which reads it once
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # dmc's ranks run on DMC_THREADS threads each (docs/runtime.md, "Cores"): OpenBLAS's
    # setting no longer reaches them
    os.environ["DMC_THREADS"] = str(threads)
    # torch's OpenMP threads spin-wait by default and then starve OpenBLAS's own
    # pthreads on the same cores (measured on 2 cores: 2-7x slower steps); passive
    # waiting gives PyTorch its best multi-threaded time
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import numpy as np
        import torch
    except ImportError as e:
        sys.exit("mlp_epoch: needs torch and numpy (%s); run it with /usr/bin/python3" % e)
    torch.set_num_threads(threads)

    print("mlp_epoch: %s (%s), B=%d, one epoch of Fashion-MNIST, %d thread(s) (OpenBLAS and torch, "
          "OMP_WAIT_POLICY=%s), torch %s, %d run(s) each"
          % (os.path.relpath(args.model),
             "inputs standardised with mean %g, std %g" % args.norm if args.norm else "raw inputs", B, threads, os.environ["OMP_WAIT_POLICY"], torch.__version__, args.runs))
    sys.stdout.flush()

    dmc_runs, torch_runs = [], []
    for i in range(args.runs):
        dmc_runs.append(run_dmc(args, os.environ))
        torch_runs.append(run_torch(args, np, torch))
        if args.runs > 1:
            print("  run %d: dmc train %.2f s, pytorch train %.2f s" % (i + 1, dmc_runs[-1][1], torch_runs[-1][0]))
            sys.stdout.flush()
    compile_s = min(r[0] for r in dmc_runs)
    dmc = min(dmc_runs, key=lambda r: r[1])
    _, dmc_s, dmc_steps, dmc_acc, dmc_wall = dmc
    print("dmc:     compile %.2f s (dmc + cc); train %.2f s (%d steps, %.1f ms/step); "
          "test accuracy %.4f; whole `dmc run` %.2f s"
          % (compile_s, dmc_s, dmc_steps, 1e3 * dmc_s / dmc_steps, dmc_acc, dmc_wall))
    pt_s, pt_steps, pt_acc, load_s = min(torch_runs, key=lambda r: r[0])
    print("pytorch: train %.2f s (%d steps, %.1f ms/step); test accuracy %.4f; data loading %.2f s"
          % (pt_s, pt_steps, 1e3 * pt_s / pt_steps, pt_acc, load_s))
    print("ratio pytorch_time / dmc_time = %.2f (> 1: dmc is faster)" % (pt_s / dmc_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
