"""test_gpu_paths.py DMC SRCROOT WHAT MODEL: the CUDA target's checkpoints and predict, run.

WHAT is
  resume   on the CUDA target, STEPS steps in one run and STEPS/2 + --resume + STEPS/2
           (the checkpoint holds the parameters, the optimizer state read from device
           memory, and the step) give bitwise the same weights; MODEL mlp also on the
           data=2 x tensor=2 mesh (host-staged threads), whose state is gathered whole
           from every rank's device block;
  predict  --predict on the CUDA target and on the C target, from the same trained weights
           (--init), over more rows than a batch (a full batch and a padded short one):
           the outputs agree within float rounding (cuBLAS and OpenBLAS sum products in
           other orders).
MODEL: mlp or gpt (test_equivalence.py's sizes). Exit 77 (a meson skip) without a GPU:
these paths are compiled by the cuda-build test and have not run on a GPU otherwise.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "spmd"))
import stio  # noqa: E402
import dmcrun  # noqa: E402
from dmcrun import Failure  # noqa: E402
import test_equivalence as eq  # noqa: E402

STEPS = 4
PREDICT_RTOL, PREDICT_ATOL = 1e-4, 1e-5


def dmc_run(dmc, dm_file, tmp, args, target):
    cmd = [dmc, "run", dm_file, "--quiet", "--target", target] + args
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=600, env=dict(os.environ, TMPDIR=tmp))
    if r.returncode != 0:
        raise Failure("`%s` exited %d:\n%s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r.stdout


def bitwise(tag, got, want):
    if sorted(got) != sorted(want):
        raise Failure("%s: tensors %s, expected %s" % (tag, sorted(got), sorted(want)))
    for name in want:
        if got[name].shape != want[name].shape or got[name].tobytes() != want[name].tobytes():
            raise Failure("%s: %s differs (max %.3g)" % (tag, name, float(np.max(np.abs(got[name] - want[name])))))


def resume(dmc, root, model, tmp):
    dm_file, sizes = eq.MODELS[model]
    dm_file = os.path.join(root, dm_file)
    batch_file = os.path.join(tmp, "batches.safetensors")
    stio.save({k: v[:STEPS] for k, v in eq.batches(model, sizes, np.random.default_rng(5)).items()}, batch_file)
    meshes = [None] + (["data=2,tensor=2"] if model == "mlp" else [])
    done = []
    for mesh in meshes:
        tag = mesh.replace("=", "").replace(",", "_") if mesh else "serial"
        common = ["--set", sizes, "--seed", "7", "--batch-file", batch_file]
        if mesh:
            common += ["--mesh", mesh, "--backend", "threads"]
        whole = os.path.join(tmp, "whole-%s.safetensors" % tag)
        resumed = os.path.join(tmp, "resumed-%s.safetensors" % tag)
        ckpt = os.path.join(tmp, "ckpt-%s" % tag)
        dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--save", whole], "cuda")
        dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS // 2), "--checkpoint", ckpt], "cuda")
        dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--resume", ckpt, "--save", resumed], "cuda")
        bitwise("%s %s resumed" % (model, tag), stio.load(resumed), stio.load(whole))
        done.append(tag)
    return "%s: %d steps and %d + --resume + %d give bitwise the same weights on the CUDA target (%s)" % (
        model, STEPS, STEPS // 2, STEPS // 2, ", ".join(done))


def predict(dmc, root, model, tmp):
    dm_file, sizes = eq.MODELS[model]
    dm_file = os.path.join(root, dm_file)
    dims = {k: int(v) for k, v in (kv.split("=") for kv in sizes.split(","))}
    train = eq.batches(model, sizes, np.random.default_rng(5))
    batch_file = os.path.join(tmp, "batches.safetensors")
    stio.save({k: v[:2] for k, v in train.items()}, batch_file)
    weights = os.path.join(tmp, "weights.safetensors")
    dmc_run(dmc, dm_file, tmp, ["--set", sizes, "--seed", "7", "--batch-file", batch_file, "--steps", "2", "--save",
                                weights], "c")
    # a full batch and a short one: rows B + 3, from the next steps' inputs
    rows = dims["B"] + 3
    inputs = {k: np.concatenate([v[2], v[3]])[:rows] for k, v in train.items() if k in ("x", "tokens")}
    inputs_file = os.path.join(tmp, "inputs.safetensors")
    stio.save(inputs, inputs_file)
    outs = {}
    for target in ("c", "cuda"):
        outs[target] = os.path.join(tmp, "out-%s.safetensors" % target)
        dmc_run(dmc, dm_file, tmp, ["--set", sizes, "--init", weights, "--predict", "--batch-file", inputs_file,
                                    "--out", outs[target]], target)
    c, g = stio.load(outs["c"]), stio.load(outs["cuda"])
    if sorted(c) != sorted(g):
        raise Failure("predict: the CUDA target wrote %s, the C target %s" % (sorted(g), sorted(c)))
    worst = 0.0
    for name in c:
        if c[name].shape != g[name].shape or c[name].shape[0] != rows:
            raise Failure("predict: %s has shape %s on CUDA, %s on C (%d rows)" % (name, g[name].shape, c[name].shape,
                                                                                  rows))
        if not np.allclose(g[name], c[name], rtol=PREDICT_RTOL, atol=PREDICT_ATOL):
            raise Failure("predict: %s differs by up to %.3g" % (name, float(np.max(np.abs(g[name] - c[name])))))
        worst = max(worst, float(np.max(np.abs(g[name] - c[name]))))
    return "%s: --predict of %d rows on CUDA equals the C target's within %.0e + %.0e relative (max %.1e)" % (
        model, rows, PREDICT_ATOL, PREDICT_RTOL, worst)


def main(argv):
    if len(argv) != 5 or argv[3] not in ("resume", "predict") or argv[4] not in eq.MODELS:
        sys.stderr.write("usage: %s DMC SRCROOT resume|predict MODEL\n" % argv[0])
        return 2
    dmc, root, what, model = os.path.abspath(argv[1]), os.path.abspath(argv[2]), argv[3], argv[4]
    return run_on_gpu(what, lambda tmp: (resume if what == "resume" else predict)(dmc, root, model, tmp))


def run_on_gpu(what, check):
    """77 (a meson skip) without a GPU; else check(tmp) in a fresh directory, which it
    returns what passed from or raises a Failure in: the PASS or FAIL line and 0 or 1."""
    if dmcrun.gpu_count() == 0:
        print("SKIP: the CUDA target needs a GPU, and nvidia-smi lists none here")
        return 77
    tmp = tempfile.mkdtemp(prefix="dmc-gpu-%s-" % what)
    try:
        print("PASS: " + check(tmp))
        return 0
    except Failure as e:
        print("FAIL: %s" % e)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
