"""test_gpu_vs_c.py DMC SRCROOT MODEL: the C target is the oracle of the CUDA target.

For MODEL (mlp, gpt, gated, dropout or llama-gqa, test_equivalence.py's sizes), from the same seed and batches:
  - the initial weights (--steps 0 --save) are bit-identical: both targets draw them on
    the host with the same generator and the CUDA target copies them to the device;
  - every loss of STEPS steps, the step-1 gradients and the final weights agree within
    test_equivalence.py's bounds (cuBLAS and OpenBLAS sum products in other orders: the
    differences are float rounding, as between two meshes).
Exit 77 (a meson skip) without a GPU.
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


def run(dmc, dm_file, tmp, args, target):
    cmd = [dmc, "run", dm_file, "--quiet", "--target", target] + args
    return dmcrun.step_losses(cmd, tmp, timeout=600, env=dict(os.environ, TMPDIR=tmp))


def main(argv):
    dmc, root, model = os.path.abspath(argv[1]), os.path.abspath(argv[2]), argv[3]
    if dmcrun.gpu_count() == 0:
        print("SKIP: the CUDA target needs a GPU, and nvidia-smi lists none here")
        return 77
    dm_file, sizes = eq.MODELS[model]
    dm_file = os.path.join(root, dm_file)
    tmp = tempfile.mkdtemp(prefix="dmc-gpu-vs-c-")
    try:
        batch_file = os.path.join(tmp, "batches.safetensors")
        stio.save(eq.batches(model, sizes, np.random.default_rng(3)), batch_file)
        results = {}
        for target in ("c", "cuda"):
            init = os.path.join(tmp, "init-%s.safetensors" % target)
            run(dmc, dm_file, tmp, ["--set", sizes, "--seed", "7", "--steps", "0", "--save", init,
                                    "--batch-file", batch_file], target)
            saved = os.path.join(tmp, "weights-%s.safetensors" % target)
            grads = os.path.join(tmp, "grads-%s.safetensors" % target)
            losses = run(dmc, dm_file, tmp, ["--set", sizes, "--batch-file", batch_file, "--steps", str(eq.STEPS),
                                             "--seed", "7", "--save", saved, "--dump-grads", grads], target)
            results[target] = (stio.load(init), losses, stio.load(grads), stio.load(saved))
        c, g = results["c"], results["cuda"]
        init_err, init_name = eq.max_difference("init", g[0], c[0])
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(g[1], c[1])) if len(g[1]) == len(c[1]) else float("inf")
        grad_err, grad_name = eq.max_difference("grads", g[2], c[2])
        weight_err, weight_name = eq.max_difference("weights", g[3], c[3])
        print("%s cuda vs c: initial weights %.1e (bound 0) in %s, losses %.1e (bound %.0e), step-1 grads %.1e (%.0e) "
              "in %s, weights %.1e (%.0e) in %s" % (model, init_err, init_name, loss_err, eq.LOSS_RTOL, grad_err,
                                                    eq.GRAD_ATOL, grad_name, weight_err, eq.WEIGHT_ATOL[model],
                                                    weight_name))
        checks = [(init_err == 0, "initial weights differ"), (loss_err <= eq.LOSS_RTOL, "losses differ"),
                  (grad_err <= eq.GRAD_ATOL, "step-1 gradients differ"),
                  (weight_err <= eq.WEIGHT_ATOL[model], "final weights differ")]
        failed = [what for ok, what in checks if not ok]
        print("%d passed, %d failed" % (len(checks) - len(failed), len(failed)))
        return 1 if failed else 0
    except Failure as e:
        print("FAIL %s" % e)
        print("0 passed, 1 failed")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
