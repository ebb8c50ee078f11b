"""test_gpu_attention16_gpt.py DMC SRCROOT: gpt.dm under --precision bf16 and fp16 on the CUDA
target, whose fused attention runs through cuDNN in that type (runtime/cuda/attention16.cu),
against the C target at the same precision, whose attention stays f32 (docs/precision.md).

From the same seed and batches (test_equivalence.py's gpt sizes, 10 steps), every loss must
agree within LOSS_RTOL (relative) and every step-1 gradient within GRAD_RTOL of the largest
magnitude of its tensor. The two differ by the attention's 16-bit rounding (its q, k, v, the
probabilities and its results rounded to 2^-8 relative in bf16, 2^-11 in fp16) on top of
float rounding; the bounds are estimates with room, set before the test ever ran on a GPU
(measure and tighten them on the first run). For scale: the C target's bf16 products against
its f32 ones differ by 3.6e-5 in these losses and 5.9e-3 in a step-1 gradient (measured).
The CUDA runs set DMRT_CUDNN_ATTENTION=require. Exit 77 (a meson skip) without a GPU.
"""
import os
import shutil
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

LOSS_RTOL = {"bf16": 1e-3, "fp16": 5e-4}
GRAD_RTOL = {"bf16": 3e-2, "fp16": 1e-2}


def run(dmc, dm_file, tmp, sizes, batch_file, precision, target, grads):
    cmd = [dmc, "run", dm_file, "--quiet", "--target", target, "--set", sizes, "--batch-file", batch_file,
           "--steps", str(eq.STEPS), "--seed", "7", "--precision", precision, "--dump-grads", grads]
    # cuDNN must run the attention: a shape it makes no plan for fails rather than running
    # the f32 kernel (which would pass these bounds and hide it)
    env = dict(os.environ, TMPDIR=tmp, DMRT_CUDNN_ATTENTION="require")
    return dmcrun.step_losses(cmd, tmp, timeout=600, env=env)


def compare(precision, c, g):
    """The failures of the CUDA run g against the C run c: (losses, gradients)."""
    problems = []
    if len(g[0]) != len(c[0]):
        return ["%s: %d losses on CUDA, %d on C" % (precision, len(g[0]), len(c[0]))]
    loss_err = max(abs(a - b) / abs(b) for a, b in zip(g[0], c[0]))
    grad_err, grad_name = 0.0, ""
    for name, want in c[1].items():
        got = g[1][name]
        err = dmcrun.nan_worst(float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-30))
        if err > grad_err:
            grad_err, grad_name = err, name
    print("gpt %s cuda (cuDNN attention) vs c: losses %.1e (bound %.0e), step-1 grads %.1e (bound %.0e) in %s"
          % (precision, loss_err, LOSS_RTOL[precision], grad_err, GRAD_RTOL[precision], grad_name))
    if not loss_err <= LOSS_RTOL[precision]:
        problems.append("%s: losses differ by %.1e relative" % (precision, loss_err))
    if not grad_err <= GRAD_RTOL[precision]:
        problems.append("%s: step-1 gradient %s differs by %.1e of its largest" % (precision, grad_name, grad_err))
    return problems


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    if dmcrun.gpu_count() == 0:
        print("SKIP: the CUDA target needs a GPU, and nvidia-smi lists none here")
        return 77
    dm_file, sizes = eq.MODELS["gpt"]
    dm_file = os.path.join(root, dm_file)
    tmp = tempfile.mkdtemp(prefix="dmc-attention16-")
    problems = []
    try:
        batch_file = os.path.join(tmp, "batches.safetensors")
        stio.save(eq.batches("gpt", sizes, np.random.default_rng(3)), batch_file)
        for precision in ("bf16", "fp16"):
            results = {}
            for target in ("c", "cuda"):
                grads = os.path.join(tmp, "grads-%s-%s.safetensors" % (precision, target))
                losses = run(dmc, dm_file, tmp, sizes, batch_file, precision, target, grads)
                results[target] = (losses, stio.load(grads))
            problems += compare(precision, results["c"], results["cuda"])
    except Failure as e:
        problems.append(str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
