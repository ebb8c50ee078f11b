"""Running `dmc run` from the PyTorch reference tests and reading its step losses."""
import os
import subprocess


class Failure(Exception):
    """A check failed; the message says which and by how much."""


def run_dmc(dmc, dm_file, tmp, args, timeout):
    """Runs `dmc run DM_FILE --quiet ARGS` in tmp; returns the losses of its step lines."""
    cmd = [dmc, "run", dm_file, "--quiet"] + args
    env = dict(os.environ, TMPDIR=tmp)
    try:
        r = subprocess.run(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
    except OSError as e:
        raise Failure("cannot run %s: %s" % (dmc, e))
    if r.returncode != 0:
        raise Failure("`%s` exited %d:\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    losses = []
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "step" and f[2] == "loss":
            if int(f[1]) != len(losses) + 1:
                raise Failure("`%s`: step lines out of order: %r" % (" ".join(cmd), line))
            losses.append(float(f[3]))
    return losses
