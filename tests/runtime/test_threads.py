#!/usr/bin/env python3
"""test_threads.py DMC: a rank's loops on several threads (docs/runtime.md, "Cores").

  - threads_loops.dm (every kind of loop the C target splits, each large enough to be
    split, and no matrix product) trained 3 steps with --threads 1, 2 and 3: the losses,
    the gradients of step 1 (--dump-grads) and the final weights (--save) are the same
    bits for every count (the loops split rows and columns in fixed chunks without
    changing the order of any sum);
  - examples/gpt.dm (a config whose loops, products and attention are split: B*T*C =
    65536 elements, products of 8.4M multiply-adds), fused attention and unfused: with 3
    threads, twice the same bits; with 2 and 3, the losses of 1 thread within 1e-5
    (OpenBLAS's result for a panel of rows may differ in the last bit from its result for
    the whole product: its kernels for the edges of a matrix add in another order);
  - the threads really run: while a run with --threads 3 trains, its process has at
    least 2 threads more than one with --threads 1 (OpenMP's team);
  - DMC_THREADS=2 is --threads 2 (same bits, and the summary says "2 threads per rank");
    without either, a serial run has dmrt_cores() threads and data=2 half of them
    (at least 1);
  - --threads 0, --threads x and DMC_THREADS=0 are usage errors (exit 2, the value named).
Prints one line per check; exits 1 on any failure.
"""
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT = os.path.join(ROOT, "examples", "gpt.dm")
LOOPS = os.path.join(ROOT, "tests", "runtime", "threads_loops.dm")
CONFIG = ["--set", "V=256,T=64,C=128,NH=4,L=2,B=8"]
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


def corpus(tmp):
    path = os.path.join(tmp, "corpus.txt")
    with open(path, "w") as f:
        for i in range(400):
            f.write("line %d: the quick brown fox jumps over the lazy dog %d times\n" % (i, i * 7 % 13))
    return path


def build(dmc, tmp, data, name, source, extra):
    keep = os.path.join(tmp, name)
    r = subprocess.run([dmc, "run", source, "--keep", keep] + extra + ["--data", "text:" + data, "--steps", "0", "--quiet"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    check(r.returncode == 0, "%s: dmc run builds the trainer (%s)" % (name, r.stderr.strip()[-300:]))
    return os.path.join(keep, os.path.splitext(os.path.basename(source))[0])


def env_with(threads_env):
    env = dict(os.environ)
    env.pop("DMC_THREADS", None)
    if threads_env is not None:
        env["DMC_THREADS"] = threads_env
    return env


def train(exe, data, tmp, tag, args, threads_env=None, steps=3):
    save, grads = os.path.join(tmp, tag + ".w"), os.path.join(tmp, tag + ".g")
    r = subprocess.run([exe, "--data", "text:" + data, "--steps", str(steps), "--save", save, "--dump-grads", grads] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600,
                       env=env_with(threads_env))
    losses = re.findall(r"^step \d+ loss (\S+)", r.stdout, re.M)
    ok = r.returncode == 0 and len(losses) == steps
    return ok, losses, read(save) if ok else b"", read(grads) if ok else b"", r.stderr


def read(path):
    with open(path, "rb") as f:
        return f.read()


def summary_threads(stderr):
    m = re.search(r"; (\d+) threads? per rank$", stderr, re.M)
    return int(m.group(1)) if m else None


def same_bits(exe, data, tmp, name):
    ok1, losses1, w1, g1, _ = train(exe, data, tmp, name + "1", ["--threads", "1"])
    check(ok1 and len(w1) > 0, "%s --threads 1 trains" % name)
    for n in (2, 3):
        ok, losses, w, g, _ = train(exe, data, tmp, name + str(n), ["--threads", str(n)])
        check(ok and losses == losses1, "%s --threads %d: the losses of --threads 1 (%s vs %s)" % (name, n, losses, losses1))
        check(ok and g == g1, "%s --threads %d: step 1's gradients, bitwise" % (name, n))
        check(ok and w == w1, "%s --threads %d: the weights after 3 steps, bitwise" % (name, n))
    return losses1, w1


def close_losses(exe, data, tmp, name):
    """Same bits for the same count; the losses of 1 thread within 1e-5 for others."""
    ok1, losses1, w1, _, _ = train(exe, data, tmp, name + "1", ["--threads", "1"])
    check(ok1, "%s --threads 1 trains" % name)
    ok, _, w3, g3, _ = train(exe, data, tmp, name + "3", ["--threads", "3"])
    again, _, w3b, g3b, _ = train(exe, data, tmp, name + "3b", ["--threads", "3"])
    check(ok and again and w3 == w3b and g3 == g3b, "%s --threads 3 twice: the same gradients and weights, bitwise" % name)
    for n in (2, 3):
        ok, losses, _, _, _ = train(exe, data, tmp, name + str(n), ["--threads", str(n)])
        near = ok and len(losses) == len(losses1) and all(
            abs(float(a) - float(b)) <= 1e-5 * abs(float(b)) for a, b in zip(losses, losses1))
        check(near, "%s --threads %d: the losses of --threads 1 within 1e-5 (%s vs %s)" % (name, n, losses, losses1))
    return losses1, w1


def most_tasks(exe, data, threads):
    """The most threads the trainer's process had while it trained with --threads threads."""
    p = subprocess.Popen([exe, "--data", "text:" + data, "--steps", "40", "--quiet", "--threads", str(threads)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_with(None))
    most = 0
    while p.poll() is None:
        try:
            most = max(most, len(os.listdir("/proc/%d/task" % p.pid)))
        except OSError:
            pass
        time.sleep(0.01)
    return most


def main():
    dmc = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        data = corpus(tmp)
        loops = build(dmc, tmp, data, "loops", LOOPS, [])
        losses1, w1 = same_bits(loops, data, tmp, "threads_loops.dm")
        fused = build(dmc, tmp, data, "fused", GPT, CONFIG)
        unfused = build(dmc, tmp, data, "unfused", GPT, CONFIG + ["--no-fuse-attention"])
        close_losses(fused, data, tmp, "gpt.dm")
        close_losses(unfused, data, tmp, "gpt.dm --no-fuse-attention")

        one, three = most_tasks(loops, data, 1), most_tasks(loops, data, 3)
        check(three >= one + 2, "--threads 3 runs on more threads: %d at most, %d with --threads 1" % (three, one))

        ok, losses, w, _, err = train(loops, data, tmp, "env2", [], threads_env="2")
        check(ok and losses == losses1 and w == w1 and summary_threads(err) == 2,
              "DMC_THREADS=2 is --threads 2 (summary: %s threads per rank)" % summary_threads(err))
        ok, _, _, _, err = train(loops, data, tmp, "env2flag3", ["--threads", "3"], threads_env="2")
        check(ok and summary_threads(err) == 3, "--threads 3 overrides DMC_THREADS=2 (summary: %s)" % summary_threads(err))
        cores = len(os.sched_getaffinity(0))
        ok, _, _, _, err = train(loops, data, tmp, "default", [])
        check(ok and summary_threads(err) == cores, "serial default: the %d cores (summary: %s)" % (cores, summary_threads(err)))
        data2 = build(dmc, tmp, data, "data2", GPT, CONFIG + ["--mesh", "data=2"])
        ok, _, _, _, err = train(data2, data, tmp, "data2", [])
        check(ok and summary_threads(err) == max(1, cores // 2),
              "data=2: each rank half the %d cores (summary: %s)" % (cores, summary_threads(err)))

        for args, env, named in ((["--threads", "0"], None, "'0' for --threads"), (["--threads", "x"], None, "'x' for --threads"),
                                 ([], "0", "'0' for the environment variable DMC_THREADS")):
            r = subprocess.run([loops, "--data", "text:" + data, "--steps", "1"] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=120, env=env_with(env))
            check(r.returncode == 2 and named in r.stderr, "%s DMC_THREADS=%s: usage error naming %s (%d: %s)" %
                  (" ".join(args), env, named, r.returncode, r.stderr.strip()[:200]))
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
