"""test_recompute.py DMC SRCROOT: activation recomputation changes memory, never results.

For the tiny examples/gpt.dm (4 transformer blocks) and tests/spmd/stack.dm (four
residual blocks), on the serial program, data=2 x tensor=2 and data=2 x pipeline=2 (1F1B,
4 micro-batches), training 2 steps with `--recompute full` (every mesh), `--recompute selective` (serial and
the pipeline) and `marked` (stack.dm with b2 and b3 called inside recompute(...), every
mesh) must give:
  - the same losses, digit for digit, as the same program (stack.dm itself for the marked
    copy) on the same mesh without recomputation (`--recompute off`), and the same final
    weights bit for bit (the copies are the same
    ops on the same operands: the oracle is the run without recomputation);
  - an activation arena in `--explain=json` (memory.activations) never larger than
    without, and smaller on one rank (serial) and for the transformer on every mesh (the
    originals die after the forward pass; stack.dm's sharded ranks peak where nothing
    recomputed is live, so their arena stays the same, the planner reaching the most
    bytes live at once either way); and the run allocates what --explain predicts for
    every rank (`dmc run --memory`, as test_memory.py).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
from dmcrun import Failure, run_dmc  # noqa: E402

STEPS = 2
MODELS = {"gpt": ("examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=4,B=8"), "stack": ("tests/spmd/stack.dm", "B=16,D=32,H=64,K=8")}
MESHES = [[], ["--mesh", "data=2,tensor=2"], ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "1f1b"]]


def batches(model, sets, rng):
    dims = {k: int(v) for k, v in (kv.split("=") for kv in sets.split(","))}
    if model == "stack":
        return {"x": rng.standard_normal((STEPS, dims["B"], dims["D"])).astype(np.float32),
                "y": rng.integers(0, dims["K"], (STEPS, dims["B"])).astype(np.int32)}
    shape = (STEPS, dims["B"], dims["T"])
    return {"tokens": rng.integers(0, dims["V"], shape).astype(np.int32),
            "targets": rng.integers(0, dims["V"], shape).astype(np.int32)}


def marked_copy(root, tmp):
    """stack.dm with b2 and b3 called inside recompute(...)."""
    text = open(os.path.join(root, "tests/spmd/stack.dm")).read()
    for call in ("h2 = b2(h1)", "h3 = b3(h2)"):
        if call not in text:
            raise Failure("stack.dm no longer has '%s'" % call)
        lhs, rhs = call.split(" = ")
        text = text.replace(call, "%s = recompute(%s)" % (lhs, rhs))
    path = os.path.join(tmp, "stack_marked.dm")
    with open(path, "w") as f:
        f.write(text)
    return path


def activations(dmc, dm, sets, extra):
    r = subprocess.run([dmc, "--explain=json", dm, "--set", sets] + extra, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        raise Failure("explain failed: %s" % r.stderr)
    plan = json.loads(r.stdout)
    return plan["memory_bytes_per_rank"]["activations"], plan


def run(dmc, dm, sets, bf, tmp, tag, extra):
    """Losses, the final weights' bytes and each rank's measured peak (--memory)."""
    saved = os.path.join(tmp, "w-%s.safetensors" % tag)
    cmd = [dmc, "run", dm, "--quiet", "--set", sets, "--batch-file", bf, "--steps", str(STEPS), "--seed", "5",
           "--save", saved, "--memory"] + extra
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(os.environ, TMPDIR=tmp), timeout=600)
    if r.returncode != 0:
        raise Failure("`%s` exited %d:\n%s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    losses = [float(m) for m in re.findall(r"^step \d+ loss (\S+)", r.stdout, re.M)]
    peaks = {int(a): int(b) for a, b in re.findall(r"^memory rank (\d+): model peak (\d+) bytes", r.stderr, re.M)}
    with open(saved, "rb") as f:
        return losses, f.read(), peaks


def check(dmc, what, dm, base_dm, sets, bf, tmp, mesh, mode, baselines):
    """One case against the run of base_dm without recomputation on the same mesh."""
    key = (base_dm, tuple(mesh))
    if key not in baselines:
        tag = re.sub(r"[^A-Za-z0-9]+", "_", "%s %s off" % (os.path.basename(base_dm), " ".join(mesh)))
        losses, weights, _ = run(dmc, base_dm, sets, bf, tmp, tag, mesh + ["--recompute", "off"])
        baselines[key] = (losses, weights, activations(dmc, base_dm, sets, mesh + ["--recompute", "off"])[0])
    want_losses, want_bytes, base = baselines[key]
    losses, got_bytes, peaks = run(dmc, dm, sets, bf, tmp, re.sub(r"[^A-Za-z0-9]+", "_", what), mesh + ["--recompute", mode])
    act, plan = activations(dmc, dm, sets, mesh + ["--recompute", mode])
    predicted = plan["memory_bytes_per_rank"]["peak_bytes_by_stage"]
    worst = 0.0
    for rank, got in peaks.items():
        # pipeline is the mesh's last axis here: a rank's stage is rank % stages
        want = predicted[rank % len(predicted)]["total"]
        worst = max(worst, abs(got - want) / want)
    print("%-58s losses %s, weights %s; activations %d -> %d bytes; measured vs predicted %.2f%%"
          % (what, "equal" if losses == want_losses else "DIFFER", "identical" if got_bytes == want_bytes else "DIFFER",
             base, act, 100 * worst))
    if len(losses) != STEPS or losses != want_losses:
        raise Failure("%s: losses %s, without recomputation %s" % (what, losses, want_losses))
    if got_bytes != want_bytes:
        raise Failure("%s: the final weights differ from the run without recomputation" % what)
    must_shrink = not mesh or "stack" not in what
    if act > base or (must_shrink and act == base):
        raise Failure("%s: activations %d bytes, %s %d without" % (what, act, "not below" if must_shrink else "above", base))
    if len(peaks) != plan.get("ranks", 1) or worst > 0.05:
        raise Failure("%s: measured peaks %s vs predicted %s" % (what, peaks, predicted))


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    failures, checks, baselines = [], 0, {}
    with tempfile.TemporaryDirectory(prefix="dmc-recompute-") as tmp:
        cases = []  # (what, dm, the program it must equal, sizes, batches, mode, meshes)
        for model, (dm, sets) in MODELS.items():
            bf = os.path.join(tmp, model + ".safetensors")
            stio.save(batches(model, sets, np.random.default_rng(1)), bf)
            dm = os.path.join(root, dm)
            cases.append((model, dm, dm, sets, bf, "full", MESHES))
            cases.append((model, dm, dm, sets, bf, "selective", MESHES[::2]))
        stack, sets = os.path.join(root, MODELS["stack"][0]), MODELS["stack"][1]
        cases.append(("stack with recompute(...) on b2, b3", marked_copy(root, tmp), stack, sets,
                      os.path.join(tmp, "stack.safetensors"), "marked", MESHES))
        for what, dm, base_dm, sets, bf, mode, meshes in cases:
            for mesh in meshes:
                checks += 1
                try:
                    check(dmc, "%s %s --recompute %s" % (what, " ".join(mesh) or "serial", mode), dm, base_dm, sets,
                          bf, tmp, mesh, mode, baselines)
                except Failure as e:
                    failures.append(str(e))
                    print("FAIL %s" % e)
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
