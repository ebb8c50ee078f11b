"""Running `dmc run` from the PyTorch reference tests and reading its step losses."""
import math
import os
import shutil
import subprocess
import sys

# The GPU suite (tests/gpu/meson.build) runs these same tests on the CUDA target by
# setting DMC_TEST_TARGET=cuda: every `dmc run` then gets --target cuda, and a machine
# without a GPU skips the test (exit 77) before anything is compared.
TARGET = os.environ.get("DMC_TEST_TARGET", "c")


def gpu_count():
    """GPUs nvidia-smi lists (0 without a driver); 1 under the CPU emulation of the CUDA
    target (DMC_CUDA_EMULATED=1, set with NVCC and DMC_CFLAGS by the gpu-emulated suite:
    tests/gpu/emu)."""
    if os.environ.get("DMC_CUDA_EMULATED") == "1":
        return 1
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        r = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def require_target():
    """Exits 77 (a meson skip) with a SKIP line when the target's hardware is missing."""
    if TARGET == "cuda" and gpu_count() == 0:
        print("SKIP: the CUDA target needs a GPU, and nvidia-smi lists none here")
        sys.exit(77)


def target_args():
    """What every `dmc run` of the test gets for its target."""
    return [] if TARGET == "c" else ["--target", TARGET]


class Failure(Exception):
    """A check failed; the message says which and by how much."""


def import_reference():
    """(numpy, torch), or None after printing the skip line when they are not importable
    (the caller exits 77, a meson skip)."""
    try:
        import numpy
        import torch
    except ImportError as e:
        print("SKIP: torch/numpy not importable (%s); use /usr/bin/python3" % e)
        return None
    return numpy, torch


def reference_main(argv, body):
    """The main of a reference test run as `TEST DMC SOURCE_ROOT`: exit status 2 on another
    use, 77 without torch and numpy (import_reference's skip), else body(dmc, root, np,
    torch) with the two paths absolute: a Failure it raises, or a `dmc` that timed out, is a
    FAIL line and 1; else it returns what passed, printed as the PASS line, and 0."""
    if len(argv) != 3:
        sys.stderr.write("usage: %s DMC SOURCE_ROOT\n" % argv[0])
        return 2
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    ref = import_reference()
    if not ref:
        return 77
    np, torch = ref
    try:
        passed = body(dmc, root, np, torch)
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 1
    except subprocess.TimeoutExpired as e:
        print("FAIL: timed out: %s" % e, file=sys.stderr)
        return 1
    print("PASS: %s" % passed)
    return 0


def step_losses(cmd, cwd, timeout, env=None):
    """Runs cmd in cwd; returns the losses of its `step N loss X` lines, in order."""
    return [fields["loss"] for fields in step_fields(cmd, cwd, timeout, env)]


def step_fields(cmd, cwd, timeout, env=None, first_step=1):
    """Runs cmd in cwd; returns, in order, the fields of its `step N loss X [NAME VALUE]...`
    lines as dicts of floats ({"loss": X, "ms": .., "lr": ..}), numbered from first_step (a
    resumed run's first)."""
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
    except OSError as e:
        raise Failure("cannot run %s: %s" % (cmd[0], e))
    if r.returncode != 0:
        raise Failure("`%s` exited %d:\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    steps = []
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step" and f[2] == "loss":
            if int(f[1]) != len(steps) + first_step:
                raise Failure("`%s`: step lines out of order: %r" % (" ".join(cmd), line))
            steps.append({name: float(value) for name, value in zip(f[2::2], f[3::2])})
    return steps


def run_dmc(dmc, dm_file, tmp, args, timeout):
    """Runs `dmc run DM_FILE --quiet ARGS` in tmp (on the test's target); returns the
    losses of its step lines."""
    return [fields["loss"] for fields in run_dmc_steps(dmc, dm_file, tmp, args, timeout)]


def run_dmc_steps(dmc, dm_file, tmp, args, timeout, first_step=1):
    """The same, returning every field of the step lines (step_fields)."""
    require_target()
    cmd = [dmc, "run", dm_file, "--quiet"] + target_args() + args
    return step_fields(cmd, tmp, timeout, env=dict(os.environ, TMPDIR=tmp), first_step=first_step)


def nan_worst(x):
    """x (a float), or infinity where it is NaN: a NaN difference is the worst of all,
    where `>` and max() would pass it over (and a NaN result pass its check)."""
    return math.inf if x != x else x


def worst_at(ratio):
    """The flat index of the largest of the numpy array ratio, a NaN counting as the
    largest (numpy's argmax stops at the first NaN, but `ratio > bound` is then False)."""
    import numpy as np
    return int(np.argmax(np.where(np.isnan(ratio), np.inf, ratio)))


def check_losses(what, got, want, rtol):
    """Every printed loss within rtol of torch's, relative; prints the worst."""
    if len(got) != len(want):
        raise Failure("%s: dmc printed %d step losses, expected %d" % (what, len(got), len(want)))
    worst, at = 0.0, 0
    for i, (g, w) in enumerate(zip(got, want)):
        rel = nan_worst(abs(g - w) / abs(w))
        if rel > worst:
            worst, at = rel, i

    def show(vs):
        text = ["%.6f" % v for v in vs]
        return ", ".join(text if len(text) <= 4 else text[:3] + ["..."] + text[-1:])
    print("%-12s losses: max rel error %.3g (bound %.0e) at step %d; dmc %s; torch %s"
          % (what, worst, rtol, at + 1, show(got), show(want)))
    if worst > rtol:
        raise Failure("%s: loss of step %d: dmc %.9g vs torch %.9g, relative error %.3g > %.0e"
                      % (what, at + 1, got[at], want[at], worst, rtol))


def c_api_probe(dmc, probe, generated, out, label="C API"):
    """Compiles the C file `probe` with the generated `generated` (.c, its header beside it)
    and libdmrt, warnings as errors, under ASan and UBSan where the compiler has them, runs
    it in `out` and prints `label: <its stdout>`; a note instead when there is no compiler or
    pkg-config. A probe that fails (exit status not 0) raises Failure."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(dmc)))
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(build, "meson-uninstalled"))
    cc = os.environ.get("CC", "cc")  # tests/ref/meson.build: the compiler that built the runtime
    if not shutil.which(cc) or not shutil.which("pkg-config"):
        print("note: no %s or pkg-config: the C API check is skipped" % cc)
        return
    flags = subprocess.run(["pkg-config", "--cflags", "--static", "--libs", "dmrt"], env=env, check=True,
                           stdout=subprocess.PIPE, universal_newlines=True).stdout.split()
    base = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-I" + os.path.dirname(generated), probe,
            generated] + flags
    exe = os.path.join(out, "probe")
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    if subprocess.run(base + sanitize + ["-o", exe], stderr=subprocess.DEVNULL).returncode != 0:
        sanitize = []
        r = subprocess.run(base + ["-o", exe], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        if r.returncode != 0:
            raise Failure("%s does not compile with %s:\n%s" % (generated, os.path.basename(probe), r.stdout))
    r = subprocess.run([exe], cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=120)
    if r.returncode != 0:
        raise Failure("%s exited %d: %s%s" % (os.path.basename(probe), r.returncode, r.stdout, r.stderr))
    print("%s: %s%s" % (label, r.stdout.strip(), " (ASan, UBSan)" if sanitize else ""))
