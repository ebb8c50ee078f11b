"""test_memcheck.py DMC SRCROOT: one training step of the CUDA target is memcheck-clean.

Builds the tiny gpt.dm and mlp.dm for the CUDA target (dmc run --keep), then runs one
step of each under `compute-sanitizer --tool memcheck --leak-check full` with a bad
token id in the gpt batch too (the kernel must skip it, not read outside the table).
Any error compute-sanitizer reports fails the test. Exit 77 (a meson skip) without a
GPU or without compute-sanitizer.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import stio  # noqa: E402
import dmcrun  # noqa: E402

CASES = [("mlp", "examples/mlp.dm", "B=16,D=48,H=64,K=10"), ("gpt", "examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=2,B=4")]


def sanitizer():
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    path = os.path.join(home, "bin", "compute-sanitizer")
    return path if os.access(path, os.X_OK) else None


def batch(name, sets, bad):
    dims = {k: int(v) for k, v in (kv.split("=") for kv in sets.split(","))}
    rng = np.random.default_rng(0)
    if name == "mlp":
        return {"x": rng.standard_normal((1, dims["B"], dims["D"])).astype(np.float32),
                "y": rng.integers(0, dims["K"], (1, dims["B"])).astype(np.int32)}
    tok = rng.integers(0, dims["V"], (1, dims["B"], dims["T"])).astype(np.int32)
    tgt = tok.copy()
    if bad:
        tok[0, 1, 3] = dims["V"] + 5
    return {"tokens": tok, "targets": tgt}


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    if dmcrun.gpu_count() == 0:
        print("SKIP: no GPU (nvidia-smi lists none)")
        return 77
    cs = sanitizer()
    if not cs:
        print("SKIP: compute-sanitizer not found (PATH, $CUDA_HOME/bin)")
        return 77
    failures = 0
    runs = 0
    with tempfile.TemporaryDirectory(prefix="dmc-memcheck-") as tmp:
        for name, dm, sets in CASES:
            keep = os.path.join(tmp, name)
            good = os.path.join(tmp, name + ".safetensors")
            stio.save(batch(name, sets, False), good)
            dmcrun.step_losses([dmc, "run", os.path.join(root, dm), "--quiet", "--target", "cuda", "--keep", keep,
                                "--set", sets, "--batch-file", good, "--steps", "1"], tmp, timeout=600,
                               env=dict(os.environ, TMPDIR=tmp))
            batches = [(good, 0)]
            if name == "gpt":
                bad = os.path.join(tmp, name + "-bad.safetensors")
                stio.save(batch(name, sets, True), bad)
                batches.append((bad, 1))
            for path, want_rc in batches:
                runs += 1
                r = subprocess.run([cs, "--tool", "memcheck", "--leak-check", "full", "--error-exitcode", "99",
                                    os.path.join(keep, name), "--quiet", "--batch-file", path, "--steps", "1"],
                                   cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   universal_newlines=True, timeout=900)
                clean = "ERROR SUMMARY: 0 errors" in r.stdout and r.returncode == want_rc
                summary = [ln for ln in r.stdout.splitlines() if "ERROR SUMMARY" in ln]
                print("%-4s %-9s exit %d (want %d): %s" % (name, "bad ids" if want_rc else "one step", r.returncode,
                                                          want_rc, summary[-1] if summary else "no summary"))
                if not clean:
                    failures += 1
                    print(r.stdout[-4000:])
    print("%d passed, %d failed" % (runs - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
