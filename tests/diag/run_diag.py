#!/usr/bin/env python3
"""run_diag.py: golden tests of dmc's error messages.

    run_diag.py DMC [--dir DIR] [--update] [NAME ...]

Runs `DMC --check [ARGS] X.dm` for every X.dm in DIR (default: this script's
directory), from inside DIR so that messages name the file as `X.dm`. ARGS come from
an optional line `# args: --set Q=3` among the file's leading comment lines. Each file
must make dmc exit with status 1 (or the status of a leading `# exit: 0`: a program
that compiles with warnings), print nothing on stdout, and print on stderr exactly
the golden X.err; a mismatch
prints a unified diff (golden -> actual). dmc runs with a 10 s timeout and, unless it
cannot start under it (ASan), a 2 GiB address-space limit.

--update rewrites the X.err files from dmc's current output (still only for runs
that exit with the expected status): read every changed golden before committing it.
NAMEs (X or X.dm) restrict the run to those files.
"""
import argparse
import difflib
import os
import resource
import shlex
import subprocess
import sys
import tempfile

TIMEOUT_S = 10
MEMORY_LIMIT = 2 << 30


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def memory_limit_works(dmc):
    """Whether dmc starts under the limit (not under ASan, which reserves terabytes)."""
    with tempfile.NamedTemporaryFile(suffix=".dm") as f:
        p = subprocess.run([dmc, "--check", f.name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, preexec_fn=limit_memory)
        return p.returncode == 0


def case_header(path):
    """(ARGS, expected exit status) from the file's leading comment lines."""
    args, status = [], 1
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("#"):
                break
            if line.startswith("# args:"):
                args = shlex.split(line[len("# args:"):])
            elif line.startswith("# exit:"):
                status = int(line[len("# exit:"):])
    return args, status


def describe_status(rc):
    if rc < 0:
        return "killed by signal %d" % -rc
    return "exit status %d" % rc


def run_case(dmc, directory, name, args, preexec):
    args = [dmc, "--check"] + args + [name]
    try:
        p = subprocess.run(args, cwd=directory, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=TIMEOUT_S, preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        return None, b"", b""
    return p.returncode, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dmc")
    ap.add_argument("--dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--update", action="store_true", help="rewrite the .err goldens")
    ap.add_argument("names", nargs="*")
    opts = ap.parse_intermixed_args()
    dmc = os.path.abspath(opts.dmc)
    directory = os.path.abspath(opts.dir)

    cases = sorted(f for f in os.listdir(directory) if f.endswith(".dm"))
    if opts.names:
        wanted = {n if n.endswith(".dm") else n + ".dm" for n in opts.names}
        missing = wanted - set(cases)
        if missing:
            print("run_diag: no such case: %s" % ", ".join(sorted(missing)))
            return 2
        cases = [c for c in cases if c in wanted]
    if not cases:
        print("run_diag: no .dm files in %s" % directory)
        return 2

    preexec = limit_memory if memory_limit_works(dmc) else None
    failed, updated = [], []
    for name in cases:
        golden_path = os.path.join(directory, name[:-3] + ".err")
        args, want_status = case_header(os.path.join(directory, name))
        rc, out, err = run_case(dmc, directory, name, args, preexec)
        problems = []
        if rc is None:
            problems.append("did not finish within %d s" % TIMEOUT_S)
        elif rc != want_status:
            problems.append("expected exit status %d, got %s" % (want_status, describe_status(rc)))
        if out:
            problems.append("unexpected output on stdout:\n" + out.decode("utf-8", "replace"))
        if opts.update and not problems:
            old = open(golden_path, "rb").read() if os.path.exists(golden_path) else None
            if old != err:
                with open(golden_path, "wb") as f:
                    f.write(err)
                updated.append(name)
            continue
        if not os.path.exists(golden_path):
            problems.append("no golden %s (run with --update)" % os.path.basename(golden_path))
        else:
            with open(golden_path, "rb") as f:
                golden = f.read()
            if golden != err:
                diff = difflib.unified_diff(
                    golden.decode("utf-8", "replace").splitlines(True),
                    err.decode("utf-8", "replace").splitlines(True),
                    fromfile=os.path.basename(golden_path), tofile=name + " (actual stderr)")
                problems.append("stderr differs from the golden:\n" + "".join(diff))
        if problems:
            failed.append(name)
            print("FAIL %s" % name)
            for p in problems:
                print("  " + p.rstrip("\n").replace("\n", "\n  "))
            if err and not any(p.startswith("stderr differs") for p in problems):
                print("  stderr was:\n    " + err.decode("utf-8", "replace").rstrip("\n").replace("\n", "\n    "))

    stale = sorted(f for f in os.listdir(directory)
                   if f.endswith(".err") and f[:-4] + ".dm" not in os.listdir(directory))
    for s in stale:
        print("note: %s has no .dm file" % s)
    for name in updated:
        print("updated %s" % (name[:-3] + ".err"))
    print("run_diag: %d cases, %d failed%s" % (len(cases), len(failed),
                                                ", %d goldens updated" % len(updated) if opts.update else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
