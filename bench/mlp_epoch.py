#!/usr/bin/python3
"""mlp_epoch.py: one epoch of examples/mlp.dm on Fashion-MNIST, dmc vs PyTorch (CPU).

usage: bench/.venv/bin/python bench/mlp_epoch.py --dmc BUILD/driver/dmc [--threads 1,2] [--runs N]
           [--variants eager,compile] [--gemm-shapes BUILD/bench/gemm_shapes] [--precision fp32|bf16]
       (bench/.venv: PyTorch 2.x, made by `sh bench/setup_torch.sh`; /usr/bin/python3 runs
       it with Debian's torch 1.13, which has no torch.compile: that variant is then n/a)

dmc:     `dmc run examples/mlp.dm --epochs 1 --quiet`. Compile time (dmc + cc) is timed
         apart, by `dmc run examples/mlp.dm --help` (compiles, builds, and the trainer
         only prints its usage); the training time is the trainer's own
         `trained N steps in T s` (the step loop: filling batches and train_step; not
         data loading, compiling or evaluation). With DMRT_BLAS_TIME=1 the trainer also
         reports the time its steps spent in dmrt_sgemm: the BLAS share printed.
GEMMs:   the limit of a step made of nothing but its matrix products: BUILD/bench/gemm_shapes
         times mlp.dm's 8 products (3 forward; backward: the 3 weight gradients and the
         input gradients of fc3 and fc2), shapes from B, D, H, K below, alone and back to
         back through dmrt_sgemm, best pass of 30; times the epoch's steps. The script checks
         that dmc's trainer counted those 8 products a step and their flops. Beside it, the
         same products through torch.mm (torch's BLAS: MKL in PyPI's wheels), best of 30:
         the two BLAS libraries compared on this step's shapes.
PyTorch: the same model (the input standardisation `xn = (x - MEAN) / STD` read from the
         .dm file when it has one, 784-1024-1024-10, ReLU, weights xavier-uniform,
         biases zero),
         B=128, AdamW(lr=1e-3, weight_decay=1e-4; fused on torch 2.4+), one shuffled pass
         of floor(60000/128) = 468 batches (last partial batch dropped, as dmc does), data
         loaded once from the same gzipped IDX files with gzip+numpy; only the training loop
         is timed (batch gather, forward, backward, optimizer step). Variants: eager, and
         compile (torch.compile of the model, inductor; its compilation is in a warm-up
         step before the timed epoch, on a batch of the test set, which the weights are then
         reset after).
Precision (--precision, default fp32):
  fp32     as above.
  bf16     in the same run: dmc fp32, dmc `--precision bf16` (every product's operands
           rounded to bf16, f32 sums, master weights and the rest f32; docs/precision.md),
           and each torch variant with its forward and loss under
           torch.autocast("cpu", dtype=torch.bfloat16) (backward and AdamW outside). The
           sides start from different weights and batch orders (as in fp32), so the check
           is the test accuracy after the epoch: dmc bf16's and each autocast variant's
           within BF16_ACC_TOL (0.02 absolute) of dmc fp32's. Prints dmc fp32 / dmc bf16
           and best torch bf16 / dmc bf16.
Threads: each count of --threads (default 1,2) for both: DMC_THREADS for dmc
         (benchlib.dmc_thread_env), torch.set_num_threads for torch; both with
         GOMP_SPINCOUNT=3000, the trainer's default wait, unless the environment sets
         OMP_WAIT_POLICY or GOMP_SPINCOUNT (bench/benchlib.py says why).

Prints, per thread count, dmc's epoch, its BLAS share, the GEMMs-alone limit, each torch
variant's epoch and ratio best_torch_time / dmc_time (> 1: dmc is faster), and the test
accuracy of each after the epoch. With --runs N, the sides run alternately N times each
and the best time of each is reported (use it on a busy machine); each run's line also
gives that run's own ratio (its sides measured one after the other: the machine's speed
drifts over minutes, and one run's sides drift together).
"""
import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
import time

import benchlib  # bench/, beside this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, D, H, K = 128, 784, 1024, 10
BF16_ACC_TOL = 0.02   # --precision bf16: test accuracies after the epoch, absolute


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


def gemm_shapes():
    """mlp.dm's products in a step, as its generated code calls dmrt_sgemm: TA,TB,M,N,K."""
    return ["0,0,%d,%d,%d" % (B, H, D), "0,0,%d,%d,%d" % (B, H, H), "0,0,%d,%d,%d" % (B, K, H),
            "0,1,%d,%d,%d" % (B, H, K), "1,0,%d,%d,%d" % (H, K, B),
            "0,1,%d,%d,%d" % (B, H, H), "1,0,%d,%d,%d" % (H, H, B), "1,0,%d,%d,%d" % (D, H, B)]


def gemm_flops():
    return sum(2.0 * m * n * k for m, n, k in (tuple(int(x) for x in g.split(",")[2:]) for g in gemm_shapes()))


def run_gemms(args, env):
    """Seconds of one pass of the step's products alone (best of 30)."""
    r = subprocess.run([args.gemm_shapes, "-r", "30"] + gemm_shapes(), env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    m = re.search(r"^pass_ms ([0-9.]+)", r.stdout, re.M)
    if r.returncode != 0 or not m:
        sys.exit("mlp_epoch: %s failed (%d):\n%s%s" % (args.gemm_shapes, r.returncode, r.stdout, r.stderr))
    return 1e-3 * float(m.group(1))


def torch_gemms(torch):
    """Seconds of one pass of the same products through torch.mm (torch's BLAS), best of 30."""
    ops = []
    for g in gemm_shapes():
        ta, tb, m, n, k = (int(x) for x in g.split(","))
        a = torch.rand(k, m) if ta else torch.rand(m, k)
        b = torch.rand(n, k) if tb else torch.rand(k, n)
        ops.append((a.t() if ta else a, b.t() if tb else b, torch.empty(m, n)))
    best = None
    for r in range(31):
        t0 = time.perf_counter()
        for a, b, c in ops:
            torch.mm(a, b, out=c)
        dt = time.perf_counter() - t0
        best = dt if best is None or r == 1 else min(best, dt)   # pass 0 warms up
    return best


def run_dmc(args, env, precision="fp32"):
    """Returns (compile_s, train_s, steps, accuracy, wall_s, blas_share)."""
    extra = ["--precision", "bf16"] if precision == "bf16" else []
    with tempfile.TemporaryDirectory(prefix="dmc-bench-") as tmp:
        # every run compiles: compile_s is the build's time, not a copy from dmc run's cache
        env = dict(env, TMPDIR=tmp, DMC_BUILD_CACHE="off")
        t0 = time.perf_counter()
        r = subprocess.run([args.dmc, "run", args.model, "--help"] + extra, env=env, cwd=tmp,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
        compile_s = time.perf_counter() - t0
        if r.returncode != 0:
            sys.exit("mlp_epoch: `dmc run %s --help` failed (%d):\n%s" % (args.model, r.returncode, r.stderr))
        cmd = [args.dmc, "run", args.model, "--epochs", "1", "--quiet", "--data-dir", args.data_dir,
               "--seed", str(args.seed)] + extra
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
    steps = int(m.group(1))
    blas_s, step_s, calls, gflop = benchlib.parse_blas("mlp_epoch", r.stdout)
    if calls != 8 * steps or abs(gflop - 1e-9 * gemm_flops() * steps) > 1e-4 * gflop:
        sys.exit("mlp_epoch: dmc's steps made %d products, %g GFLOP; gemm_shapes() times %d a step, %g GFLOP: "
                 "update bench/mlp_epoch.py" % (calls, gflop, 8 * steps, 1e-9 * gemm_flops() * steps))
    return compile_s, float(m.group(2)), steps, float(acc[-1]), wall_s, blas_s / step_s


def load_data(args, np, torch):
    d = args.data_dir
    images = lambda name: torch.from_numpy(read_idx(os.path.join(d, name), np).reshape(-1, D).astype(np.float32) / 255.0)
    labels = lambda name: torch.from_numpy(read_idx(os.path.join(d, name), np).astype(np.int64))
    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


class TorchMLP:
    """mlp.dm in torch at the current thread count: built (and for "compile" compiled) once;
    each epoch starts from freshly initialised weights."""

    def __init__(self, args, np, torch, data, variant, bf16=False):
        import torch.nn as nn
        self.args, self.np, self.torch, self.data = args, np, torch, data

        class Standardize(nn.Module):
            def __init__(self, mean, std):
                super().__init__()
                self.mean, self.std = mean, std

            def forward(self, x):
                return (x - self.mean) / self.std

        layers = [nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, K)]
        if args.norm:
            layers.insert(0, Standardize(*args.norm))
        self.model = nn.Sequential(*layers)
        forward = self.model
        if bf16:
            def forward(x, plain=self.model):
                # the loss is taken outside, in f32 (cross_entropy autocasts to f32 anyway)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return plain(x).float()
        self.forward = torch.compile(forward) if variant == "compile" else forward
        if variant == "compile":
            self.epoch(steps=1)   # compiles forward and backward

    def epoch(self, steps=None):
        """Returns (train_s, steps, accuracy)."""
        import torch.nn as nn
        import torch.nn.functional as F
        torch, np, args = self.torch, self.np, self.args
        xtr, ytr, xte, yte = self.data
        torch.manual_seed(args.seed)
        with torch.no_grad():
            for m in self.model:
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    nn.init.zeros_(m.bias)
        opt, _ = benchlib.adamw(torch, self.model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=1e-4)
        if steps is None:
            steps = xtr.shape[0] // B
            perm = torch.from_numpy(np.random.default_rng(args.seed).permutation(xtr.shape[0]))
            xs, ys = xtr, ytr
        else:
            perm, xs, ys = torch.arange(steps * B), xte, yte
        t0 = time.perf_counter()
        for i in range(steps):
            idx = perm[i * B:(i + 1) * B]
            xb, yb = xs[idx], ys[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.forward(xb), yb)
            loss.backward()
            opt.step()
        train_s = time.perf_counter() - t0
        with torch.no_grad():
            correct = sum(int((self.model(xte[i:i + B]).argmax(1) == yte[i:i + B]).sum())
                          for i in range(0, xte.shape[0], B))
        return train_s, steps, correct / xte.shape[0]


def best_of_runs(args, np, torch, data, threads, variants):
    env = benchlib.dmc_thread_env(os.environ, threads)
    benchlib.set_torch_threads(torch, threads)
    bf16 = args.precision == "bf16"
    sides = {v: TorchMLP(args, np, torch, data, v, bf16=bf16) for v in variants}
    dmc_runs, bf16_runs, gemm_runs, torch_gemm_runs, torch_runs = [], [], [], [], {v: [] for v in variants}
    for i in range(args.runs):
        dmc_runs.append(run_dmc(args, env))
        if bf16:
            bf16_runs.append(run_dmc(args, env, "bf16"))
        gemm_runs.append(run_gemms(args, env))
        torch_gemm_runs.append(torch_gemms(torch))
        steps = dmc_runs[-1][2]
        line = "  %d thread(s), run %d: dmc %.2f s (%.0f%% BLAS)" % (threads, i + 1, dmc_runs[-1][1],
                                                                     100 * dmc_runs[-1][5])
        if bf16:
            line += ", dmc bf16 %.2f s (%.0f%% BLAS)" % (bf16_runs[-1][1], 100 * bf16_runs[-1][5])
        line += ", GEMMs alone %.2f s (torch.mm %.2f s)" % (gemm_runs[-1] * steps, torch_gemm_runs[-1] * steps)
        for v in variants:
            torch_runs[v].append(sides[v].epoch())
            line += ", %s%s %.2f s" % (v, " bf16" if bf16 else "", torch_runs[v][-1][0])
        if variants:
            mine = bf16_runs[-1][1] if bf16 else dmc_runs[-1][1]
            line += ", this run's ratio %.2fx" % (min(torch_runs[v][-1][0] for v in variants) / mine)
        print(line)
        sys.stdout.flush()
        if bf16:
            ref = dmc_runs[-1][3]
            for side, acc in [("dmc bf16", bf16_runs[-1][3])] + [(v + " autocast", torch_runs[v][-1][2])
                                                                  for v in variants]:
                if abs(acc - ref) > BF16_ACC_TOL:
                    sys.exit("mlp_epoch: %s's test accuracy %.4f is not within %g of dmc fp32's %.4f"
                             % (side, acc, BF16_ACC_TOL, ref))
    dmc = min(dmc_runs, key=lambda r: r[1])
    return {"dmc": dmc, "bf16": min(bf16_runs, key=lambda r: r[1]) if bf16 else None,
            "compile_s": min(r[0] for r in dmc_runs), "gemms": min(gemm_runs) * dmc[2],
            "torch_gemms": min(torch_gemm_runs) * dmc[2],
            "torch": {v: min(runs, key=lambda r: r[0]) for v, runs in torch_runs.items()}}


def main():
    ap = argparse.ArgumentParser(description="one epoch of examples/mlp.dm: dmc vs PyTorch CPU")
    ap.add_argument("--dmc", required=True, help="the dmc executable (BUILD/driver/dmc)")
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "mlp.dm"))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--threads", default="1,2", help="thread counts, each for both sides (default %(default)s)")
    ap.add_argument("--variants", default="eager,compile", help="PyTorch variants: eager, compile (default %(default)s)")
    ap.add_argument("--gemm-shapes", help="the gemm_shapes program (default: BUILD/bench/gemm_shapes beside --dmc)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each side; the best time is reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="fp32: all sides fp32; bf16: dmc fp32, dmc --precision bf16 and each torch variant under "
                         "CPU bf16 autocast (default %(default)s)")
    args = ap.parse_args()
    args.dmc = os.path.abspath(args.dmc)
    args.model = os.path.abspath(args.model)
    args.norm = model_norm(args.model)
    args.gemm_shapes = args.gemm_shapes or os.path.join(os.path.dirname(os.path.dirname(args.dmc)), "bench",
                                                        "gemm_shapes")
    if not os.access(args.gemm_shapes, os.X_OK):
        sys.exit("mlp_epoch: no %s (ninja -C BUILD builds it; or pass --gemm-shapes)" % args.gemm_shapes)
    thread_counts = benchlib.parse_threads(args.threads)
    benchlib.prepare_torch_env(max(thread_counts))
    np, torch = benchlib.import_torch("mlp_epoch")
    variants = []
    for v in args.variants.split(","):
        if v not in ("eager", "compile"):
            sys.exit("mlp_epoch: unknown variant %r (eager, compile)" % v)
        if v == "compile" and not benchlib.has_compile(torch):
            print("mlp_epoch: torch %s has no torch.compile: compile skipped" % torch.__version__)
        else:
            variants.append(v)

    print("mlp_epoch: %s (%s), B=%d, one epoch of Fashion-MNIST; %s; precision %s; threads %s; %d run(s) each; "
          "load average %s"
          % (os.path.relpath(args.model),
             "inputs standardised with mean %g, std %g" % args.norm if args.norm else "raw inputs", B,
             benchlib.describe_torch(torch), args.precision, args.threads, args.runs,
             " ".join("%.1f" % x for x in os.getloadavg())))
    sys.stdout.flush()
    t0 = time.perf_counter()
    data = load_data(args, np, torch)
    load_s = time.perf_counter() - t0

    results = [(threads, best_of_runs(args, np, torch, data, threads, variants)) for threads in thread_counts]

    bf16 = args.precision == "bf16"
    hdr = "%3s %8s %5s" % ("thr", "dmc s", "BLAS")
    if bf16:
        hdr += " %8s %5s %9s" % ("bf16 s", "BLAS", "fp32/bf16")
    hdr += " %8s %8s" % ("GEMMs s", "t.mm s") + "".join(" %9s" % (v + (" bf16" if bf16 else " s")) for v in variants) \
        + " %16s %7s %9s" % ("best torch", "ratio", "dmc/GEMMs")
    print(hdr)
    print("-" * len(hdr))
    for threads, r in results:
        dmc_s, share = r["dmc"][1], r["dmc"][5]
        me_s = r["bf16"][1] if bf16 else dmc_s
        top = min(variants, key=lambda v: r["torch"][v][0])
        line = "%3d %8.2f %4.0f%%" % (threads, dmc_s, 100 * share)
        if bf16:
            line += " %8.2f %4.0f%% %8.2fx" % (me_s, 100 * r["bf16"][5], dmc_s / me_s)
        print(line + " %8.2f %8.2f" % (r["gemms"], r["torch_gemms"])
              + "".join(" %9.2f" % r["torch"][v][0] for v in variants)
              + " %16s %6.2fx %8.2fx" % ("%s %.2f" % (top, r["torch"][top][0]), r["torch"][top][0] / me_s,
                                         dmc_s / r["gemms"]))
    _, r = results[0]
    print("dmc: compile %.2f s (dmc + cc); %d steps; test accuracy %s; whole `dmc run` %.2f s (%d thread(s))"
          % (r["compile_s"], r["dmc"][2], ", ".join("%.4f" % x["dmc"][3] for _, x in results), r["dmc"][4],
             results[0][0]))
    if bf16:
        print("dmc bf16: test accuracy %s (each run's, dmc bf16 and every autocast variant, checked within %g of "
              "dmc fp32's); fp32/bf16 = dmc fp32 s / dmc bf16 s; torch variants under "
              "torch.autocast(\"cpu\", dtype=torch.bfloat16); ratio = best torch bf16 / dmc bf16; GEMMs and t.mm "
              "are the fp32 products" % (", ".join("%.4f" % x["bf16"][3] for _, x in results), BF16_ACC_TOL))
    print("pytorch: %d steps; test accuracy %s; data loading %.2f s"
          % (r["torch"][variants[0]][1],
             ", ".join("%s %.4f" % (v, x["torch"][v][2]) for _, x in results for v in variants), load_s))
    print("ratio = best torch time / dmc time (> 1: dmc is faster); BLAS: share of dmc's train_step in dmrt_sgemm "
          "(DMRT_BLAS_TIME); GEMMs: the step's 8 products alone through dmrt_sgemm (bench/gemm_shapes), x %d steps; "
          "t.mm: the same through torch.mm" % r["dmc"][2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
