"""benchlib.py: what bench/gpt_step.py and bench/mlp_epoch.py share: thread counts for dmc
and for torch, the torch variants, the optimizer, and the BLAS time dmc's trainer reports.

Runs under either interpreter: /usr/bin/python3 (Debian's torch 1.13) or bench/.venv/bin/python
(PyTorch 2.x from bench/setup_torch.sh). What this torch lacks (SDPA before 2.0,
torch.compile before 2.0, fused AdamW on the CPU before 2.4) is reported as n/a.
"""
import os
import re
import sys


def trainer_spincount():
    """runtime/dmrt.h's DMRT_OPENMP_SPINCOUNT: the trainer's default OpenMP wait."""
    header = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime", "dmrt.h")
    with open(header) as f:
        m = re.search(r'^#define DMRT_OPENMP_SPINCOUNT "(\d+)"', f.read(), re.M)
    if not m:
        sys.exit("bench: no DMRT_OPENMP_SPINCOUNT in %s" % header)
    return m.group(1)


BLAS_RE = re.compile(r"^blas ([0-9.]+) s of train_step's ([0-9.]+) s \(([0-9.]+)%\), (\d+) products, ([0-9.]+) GFLOP",
                     re.M)


def parse_threads(text):
    """'1,2' -> [1, 2]"""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        sys.exit("bench: --threads wants a comma-separated list of counts >= 1, got %r" % text)
    return counts


def dmc_thread_env(env, threads):
    """The environment a `dmc run` trains in with `threads` threads. The one place that says
    how dmc's threads are set: DMC_THREADS, the threads each rank splits its loops and
    products over (docs/runtime.md, "Cores"; OpenBLAS then runs one thread a call; the
    OPENBLAS_ and OMP_ settings matter to a runtime built without OpenMP), with
    DMRT_BLAS_TIME=1 so that the trainer reports its time in matrix products (two clock
    reads per product: well under 1% of a step here)."""
    env = dict(env, DMC_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               DMRT_BLAS_TIME="1")
    return env


def prepare_torch_env(max_threads):
    """Before torch is imported: the most threads any run asks for (Debian's torch 1.13 uses
    OpenBLAS, which reads OPENBLAS_NUM_THREADS once; torch.set_num_threads lowers it later)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(max_threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(max_threads))
    # Both sides wait as dmc's trainer does by default (DMRT_OPENMP_SPINCOUNT, runtime/dmrt.h):
    # an OpenMP thread spins 3000 pauses (about 75 us on Zen 4) for work, then sleeps.
    # libgomp's default spin (300000 pauses) holds a core its partner needs on a busy 2-core
    # machine (torch 2.15, 2 threads, tiny gpt: 290 ms/step spinning, 28 passive); passive
    # waiting makes every parallel region pay a wake-up (gpt big bf16: dmc 5% slower, torch
    # about as much). OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment measures another way.
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", trainer_spincount())


def import_torch(prog):
    try:
        import numpy
        import torch
    except ImportError as e:
        sys.exit("%s: needs torch and numpy (%s); run it with bench/.venv/bin/python (sh bench/setup_torch.sh "
                 "makes it) or /usr/bin/python3" % (prog, e))
    return numpy, torch


def torch_version_tuple(torch):
    return tuple(int(x) for x in re.findall(r"\d+", torch.__version__.split("+")[0])[:2])


def has_compile(torch):
    return hasattr(torch, "compile") and torch_version_tuple(torch) >= (2, 0)


def set_torch_threads(torch, threads):
    """torch's intra-op threads; compiled code is specialised on the count, so compiled
    functions are dropped and compiled again under the new one."""
    torch.set_num_threads(threads)
    if has_compile(torch):
        torch._dynamo.reset()


def adamw(torch, params, **kw):
    """AdamW in its fastest CPU form this torch has: fused (one kernel over all parameters,
    torch 2.4+), else the default (foreach where torch picks it). Returns (optimizer, form)."""
    if torch_version_tuple(torch) >= (2, 4):
        return torch.optim.AdamW(params, fused=True, **kw), "fused"
    return torch.optim.AdamW(params, **kw), "default"


def describe_torch(torch):
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=(\w+)", cfg)
    blas = "MKL" if "Math Kernel Library" in cfg else m.group(1) if m else "BLAS unknown"
    return "torch %s (%s); %s" % (torch.__version__, blas, openmp_wait())


def openmp_wait():
    """The OpenMP wait both sides run with, as the environment sets it."""
    return ", ".join("%s=%s" % (k, os.environ[k]) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ) \
        or "libgomp's default wait"


def parse_blas(prog, stdout):
    """(blas seconds, train_step seconds, products, GFLOP) from dmc's trainer output."""
    m = BLAS_RE.search(stdout)
    if not m:
        sys.exit("%s: no 'blas ... of train_step's ...' line in dmc's output (DMRT_BLAS_TIME=1 set):\n%s"
                 % (prog, stdout[-2000:]))
    return float(m.group(1)), float(m.group(2)), int(m.group(4)), float(m.group(5))


def train_accuracies(cmd, epochs):
    """Runs a `dmc run ... --epochs E` command; returns (the test accuracy after the last
    epoch, [each epoch's], its output, seconds). The trainer prints 'epoch E test accuracy
    A' after each epoch and 'test accuracy A' at the end."""
    import subprocess
    import time
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    took = time.time() - t0
    if r.returncode != 0:
        raise RuntimeError("`%s` failed:\n%s" % (" ".join(cmd), r.stdout))
    final = re.findall(r"^test accuracy ([0-9.]+)$", r.stdout, re.M)
    per_epoch = [float(x) for x in re.findall(r"^epoch \d+ test accuracy ([0-9.]+)$", r.stdout, re.M)]
    if len(final) != 1 or len(per_epoch) != epochs:
        raise RuntimeError("`%s` printed %d final and %d epoch accuracies, not 1 and %d:\n%s" %
                           (" ".join(cmd), len(final), len(per_epoch), epochs, r.stdout))
    return float(final[0]), per_epoch, r.stdout, took
