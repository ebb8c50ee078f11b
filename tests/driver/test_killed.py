#!/usr/bin/python3
"""SIGKILL to `dmc run` leaves nothing behind (docs/trainer.md, "Stopping": dmc killed).

`dmc run examples/mlp.dm` trains on a batch file for ten million steps with --save, in a
TMPDIR of the test's; at its first step line dmc gets SIGKILL. Within a few seconds:
  - no process of the run is left: none whose executable or command line is under the
    test's directory (the trainer built in TMPDIR, mpirun's ranks, dmc's watchdog);
    zombies do not count (an init that does not reap them is no fault of dmc's);
  - the dmc-run-* build directory is gone from TMPDIR;
  - the --save file was not written;
  - the trainer said it stopped at a step boundary (it got SIGTERM, once; under mpirun,
    which passes SIGTERM on, its ranks' stderr may not reach the end).
Also killed while the C compiler runs (the compiler's processes are gone, the directory
too, and TMPDIR holds nothing: the compiler's temporary files were in the directory), and with --backend mpi on data=2 when mpirun and mpicc are installed (else that case
is skipped with a message). Whatever a failing run leaves is killed at the end.

usage: test_killed.py DMC SOURCE_ROOT
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import stio  # noqa: E402
import numpy as np  # noqa: E402

DEADLINE = 10.0  # seconds after the SIGKILL for everything to be gone
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def processes_under(root):
    """{pid: command line} of the live processes (not zombies) whose executable or any
    argument is under root."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/stat" % name) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open("/proc/%s/cmdline" % name, "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            try:
                exe = os.readlink("/proc/%s/exe" % name)
            except OSError:
                exe = ""
        except (OSError, IndexError):
            continue
        if state in ("Z", "X"):
            continue
        if exe.startswith(root) or any(root in a for a in args):
            found[int(name)] = " ".join(args)
    return found


def kill_leftovers(root):
    for pid in processes_under(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_for(pred, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def killed_run(dmc, mlp, root, label, extra, at_compile=False):
    """dmc run in a directory of root's, SIGKILLed at its first step line (or while the C
    compiler runs); then the checks."""
    case = tempfile.mkdtemp(dir=root, prefix=label + "-")
    tmpdir = os.path.join(case, "tmp")
    os.mkdir(tmpdir)
    save = os.path.join(case, "saved.safetensors")
    out_path, err_path = os.path.join(case, "stdout"), os.path.join(case, "stderr")
    args = [dmc, "run", mlp, "--set", "B=16,H=64", "--batch-file", os.path.join(root, "batch.safetensors"),
            "--steps", "10000000", "--quiet", "--save", save] + extra
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(args, cwd=case, stdout=out, stderr=err, env=dict(os.environ, TMPDIR=tmpdir, DMC_BUILD_CACHE="off"))

    def started():
        if at_compile:
            return any(pid != p.pid for pid in processes_under(tmpdir))
        with open(out_path) as f:
            return "step " in f.read()

    ready = wait_for(lambda: started() or p.poll() is not None, 120)
    if not ready or p.poll() is not None:
        p.kill()
        p.wait()
        with open(err_path) as f:
            check(False, "%s: dmc run %s before the SIGKILL (exit %s): %s" % (
                label, "never got there" if not ready else "ended", p.returncode, f.read().strip()[-400:]))
        kill_leftovers(case)
        return
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    start = time.monotonic()
    gone = wait_for(lambda: not processes_under(case), DEADLINE)
    secs = time.monotonic() - start
    left = processes_under(case)
    check(gone, "%s: no process of the run is left %.1f s after SIGKILL to dmc (%s)" % (
        label, secs, "; ".join("%d: %s" % (pid, cmd[:160]) for pid, cmd in left.items()) or "none"))
    # a compiler's temporary files go with the build directory (mpirun may leave its own
    # session directory in TMPDIR)
    removed = wait_for(lambda: not [n for n in os.listdir(tmpdir) if at_compile or n.startswith("dmc-run-")], 1.0)
    check(removed, "%s: the build directory is removed%s (TMPDIR holds %s)"
          % (label, ", and no temporary file of the compiler is left" if at_compile else "", os.listdir(tmpdir)))
    check(not os.path.exists(save), "%s: --save was not written" % label)
    if not at_compile and "mpi" not in extra:
        # SIGTERM, not SIGKILL: the trainer stopped at a step boundary (and would have
        # written its --checkpoint)
        with open(err_path) as f:
            err = f.read()
        check("stopped by a signal after step" in err, "%s: the trainer stopped at a step boundary (%s)"
              % (label, err.strip()[-300:]))
    kill_leftovers(case)


def main(argv):
    dmc, root_src = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    mlp = os.path.join(root_src, "examples", "mlp.dm")
    with tempfile.TemporaryDirectory(prefix="dmc-killed-") as root:
        rng = np.random.default_rng(0)
        stio.save({"x": rng.standard_normal((4, 16, 784)).astype(np.float32),
                   "y": rng.integers(0, 10, (4, 16)).astype(np.int32)}, os.path.join(root, "batch.safetensors"))
        killed_run(dmc, mlp, root, "threads", [])
        killed_run(dmc, mlp, root, "compiling", [], at_compile=True)
        if shutil.which("mpirun") and shutil.which("mpicc"):
            killed_run(dmc, mlp, root, "mpi", ["--backend", "mpi", "--mesh", "data=2"])
        else:
            print("skip  --backend mpi: mpirun or mpicc is not installed")
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
