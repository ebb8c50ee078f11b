"""trained.py: what the pipeline tests (test_off_loss.py, test_concat_cut.py) share: `dmc run`
with its failure as an AssertionError, a run's saved weights, and the largest difference
between two sets of them."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402


def dmc_run(dmc, dm, tmp, args):
    p = subprocess.run([dmc, "run", dm, "--quiet"] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300, env=dict(os.environ, TMPDIR=tmp))
    if p.returncode != 0:
        raise AssertionError("dmc run %s: exit %d\n%s" % (" ".join(args), p.returncode, p.stderr[-3000:]))


def train(dmc, dm, tmp, batch_file, tag, args, steps):
    """The weights after `steps` steps on batch_file (seed 7), args last (they may override)."""
    saved = os.path.join(tmp, "w-%s.safetensors" % tag)
    dmc_run(dmc, dm, tmp, ["--batch-file", batch_file, "--steps", str(steps), "--seed", "7", "--save", saved] + args)
    return stio.load(saved)


def worst(got, want):
    if sorted(got) != sorted(want):
        raise AssertionError("saved %s, expected %s" % (sorted(got), sorted(want)))
    return max(float(np.max(np.abs(got[k] - want[k]))) for k in want)


def checked(failures, what, fn):
    """Runs check fn; its AssertionError printed as what's failure and what added to failures."""
    try:
        fn()
    except AssertionError as e:
        print("FAIL %s: %s" % (what, e))
        failures.append(what)
