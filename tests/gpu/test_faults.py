"""test_faults.py DMC SRCROOT: bad data fails the step with the .dm location, not a crash.

A kernel that reads indices checks them (an embedding's token ids, cross-entropy's
targets): the first out of range is recorded and the row skipped, and the host fails
the step with `FILE.dm:LINE: ...`. For mlp.dm (a target of 12 with 10 classes) and the
tiny gpt.dm (a token id of 70 with a vocabulary of 64; a target of -1), on the serial
program, on data=2 (the bad row on rank 1's half of the batch), with micro-batches and on
data=2 x tensor=2, `dmc run` must exit 1 with exactly the expected message and print no
step. The position is the batch's, whichever rank's block or micro-batch holds it: the
row of mlp.dm's [B] targets, [row, column] of gpt.dm's [B, T] tokens and targets. The target is DMC_TEST_TARGET's
(c by default; the GPU suite runs it with cuda, and skips without a GPU).

Then a failed step must change nothing that outlives it (the serial CUDA program learns of
the fault only at the step's end, after its update was enqueued): fault_untouched.c,
built by `dmc run --cc WRAPPER` in place of the runner's main.c (CC, the C compiler that
built the runtime, does the rest), trains the tiny gpt.dm through its C API with a bad id
and a bad target between two good steps, and requires the last loss and the saved
weights bit for bit equal to those of the two good steps alone.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
from dmcrun import require_target, target_args  # noqa: E402

MLP = "B=16,D=48,H=64,K=10"
GPT = "V=64,T=16,C=32,NH=4,L=2,B=4"


def line_of(root, dm, pattern):
    """The 1-based line of dm whose text matches pattern (the op the message names)."""
    with open(os.path.join(root, dm)) as f:
        for n, text in enumerate(f, 1):
            if re.search(pattern, text):
                return n
    raise SystemExit("FAIL: %s has no line matching %r (update test_faults.py)" % (dm, pattern))


def cases(root):
    """(name, .dm, --set, mesh, batch, expected message)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 16, 48)).astype(np.float32)
    y = rng.integers(0, 10, (1, 16)).astype(np.int32)
    y_bad = y.copy()
    y_bad[0, 11] = 12  # row 11: on rank 1 of data=2 (rows 8..15), its own row 3
    tok = rng.integers(0, 64, (1, 4, 16)).astype(np.int32)
    tok_bad = tok.copy()
    tok_bad[0, 3, 5] = 70  # [3, 5]: on rank 1 of data=2, its own position 1 * 16 + 5 = 21
    tgt_bad = tok.copy()
    tgt_bad[0, 0, 2] = -1
    mlp_loss = line_of(root, "examples/mlp.dm", r"cross_entropy\(")
    gpt_embed = line_of(root, "examples/gpt.dm", r"return embed\(")
    gpt_loss = line_of(root, "examples/gpt.dm", r"cross_entropy\(")
    return [
        ("mlp target", "examples/mlp.dm", MLP, None, {"x": x, "y": y_bad},
         "mlp.dm:%d: target 12 of row 11 is outside [0, 10)" % mlp_loss),
        ("mlp target data=2", "examples/mlp.dm", MLP, "data=2", {"x": x, "y": y_bad},
         "mlp.dm:%d: target 12 of row 11 is outside [0, 10)" % mlp_loss),
        ("mlp target 4 micro", "examples/mlp.dm", MLP + " --accumulate 4", None, {"x": x, "y": y_bad},
         "mlp.dm:%d: target 12 of row 11 is outside [0, 10)" % mlp_loss),
        ("mlp data=2,tensor=2", "examples/mlp.dm", MLP + " --accumulate 2", "data=2,tensor=2", {"x": x, "y": y_bad},
         "mlp.dm:%d: target 12 of row 11 is outside [0, 10)" % mlp_loss),
        ("gpt token id", "examples/gpt.dm", GPT, None, {"tokens": tok_bad, "targets": tok},
         "gpt.dm:%d: id 70 at [3, 5] of 'tokens' is outside [0, 64)" % gpt_embed),
        ("gpt token id data=2", "examples/gpt.dm", GPT, "data=2", {"tokens": tok_bad, "targets": tok},
         "gpt.dm:%d: id 70 at [3, 5] of 'tokens' is outside [0, 64)" % gpt_embed),
        ("gpt target", "examples/gpt.dm", GPT, None, {"tokens": tok, "targets": tgt_bad},
         "gpt.dm:%d: target -1 at [0, 2] of 'targets' is outside [0, 64)" % gpt_loss),
        ("gpt target data=2", "examples/gpt.dm", GPT, "data=2", {"tokens": tok, "targets": tgt_bad},
         "gpt.dm:%d: target -1 at [0, 2] of 'targets' is outside [0, 64)" % gpt_loss),
    ]


WRAPPER = """#!%s
import os, sys
args = [%r if a.endswith("/main.c") else a for a in sys.argv[1:]]
os.execvp(%r, [%r] + args)
"""


def untouched(dmc, root, cc, tmp, batch):
    """fault_untouched.c's checks: None, or what failed."""
    wrapper = os.path.join(tmp, "cc-untouched")
    with open(wrapper, "w") as f:
        f.write(WRAPPER % (sys.executable, os.path.join(root, "tests", "gpu", "fault_untouched.c"), cc, cc))
    os.chmod(wrapper, 0o755)
    cmd = [dmc, "run", os.path.join(root, "examples/gpt.dm"), "--quiet", "--set", GPT, "--batch-file", batch,
           "--steps", "1", "--cc", wrapper, "--keep", os.path.join(tmp, "untouched")] + target_args()
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=600, env=dict(os.environ, TMPDIR=tmp))
    ok = r.returncode == 0 and "fault_untouched: ok" in r.stdout
    print("%-20s %s" % ("weights untouched", "ok" if ok else "FAIL: " + (r.stdout + r.stderr).strip()[-400:]))
    return None if ok else "weights untouched: exit %d:\n%s%s" % (r.returncode, r.stdout, r.stderr)


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    cc = argv[3] if len(argv) > 3 else os.environ.get("CC", "cc")
    require_target()
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-faults-") as tmp:
        for i, (name, dm, sets, mesh, batch, want) in enumerate(cases(root)):
            path = os.path.join(tmp, "batch%d.safetensors" % i)
            stio.save(batch, path)
            sets, *more = sets.split(" ")
            cmd = [dmc, "run", os.path.join(root, dm), "--quiet", "--set", sets, *more, "--batch-file", path,
                   "--steps", "1"] + target_args() + (["--mesh", mesh] if mesh else [])
            r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=600, env=dict(os.environ, TMPDIR=tmp))
            ok = r.returncode == 1 and want in r.stderr and "step 1 loss" not in r.stdout
            print("%-20s %s: %s" % (name, "ok" if ok else "FAIL", want if ok else r.stderr.strip()[-300:]))
            if not ok:
                failures.append("%s: expected exit 1 and '%s', got exit %d:\n%s%s"
                                % (name, want, r.returncode, r.stdout, r.stderr))
        rng = np.random.default_rng(2)
        path = os.path.join(tmp, "good.safetensors")
        stio.save({"tokens": rng.integers(0, 64, (1, 4, 16)).astype(np.int32),
                   "targets": rng.integers(0, 64, (1, 4, 16)).astype(np.int32)}, path)
        why = untouched(dmc, root, cc, tmp, path)
        if why:
            failures.append(why)
    for f in failures:
        print("\n" + f)
    n = len(cases(root)) + 1
    print("%d passed, %d failed" % (n - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
