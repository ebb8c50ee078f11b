"""test_gpu_compression.py DMC SRCROOT WHAT: --prune and distillation on the CUDA target, run.

WHAT is
  prune     mlp.dm trained 8 steps with --prune 0.5 (element by element, and :rows; gpt.dm
            with :rows, by attention heads) on the C
            target and on the CUDA one from the same seed, the sparsity ramping to the last
            step (so its mask is chosen from that step's weights): every weight matrix holds
            the same zeros on both (the masks are runtime/prune.c's rule on weights that
            differ by float rounding only; at most 1% of positions may differ, where two
            magnitudes at the threshold swap) and its other values within 1e-3 relative;
            and each CUDA weight matrix (by elements) holds as many zeros as
            torch.nn.utils.prune.l1_unstructured prunes at the schedule's ratio (which zeros:
            the C target's, whose rule runtime-prune checks against l1_unstructured itself:
            the final weights are pruned already, so l1 of them would find their own zeros);
  resume    8 pruned CUDA steps in one run and 3 + --resume + 5 (the masks are optimizer
            state, read from device memory into the checkpoint) give bitwise the same weights;
  distill   a student distilled from a teacher (tests/ref/test_distill.py's pairs) for 4
            steps on the CUDA target prints the C target's losses on the same mesh within
            1e-4 relative: serial, data=2, and data=2 x tensor=2 x pipeline=2 with 2
            micro-batches (each rank's teacher on its rank's device).
Exit 77 (a meson skip) without a GPU: these paths are compiled by the cuda-build test and
have not run on a GPU otherwise.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "spmd"))
import stio  # noqa: E402
from dmcrun import Failure  # noqa: E402
import test_distill as distill  # noqa: E402
import test_equivalence as eq  # noqa: E402
from test_gpu_paths import bitwise, dmc_run, run_on_gpu  # noqa: E402

STEPS = 8
RATIO = 0.5
MAX_MASK_DIFFERENCE = 0.01
VALUE_RTOL, VALUE_ATOL = 1e-3, 1e-5
LOSS_RTOL = 1e-4


def mlp_files(root, tmp, model="mlp"):
    dm_file, sizes = eq.MODELS[model]
    batch_file = os.path.join(tmp, "%s-batches.safetensors" % model)
    stio.save({k: v[:STEPS] for k, v in eq.batches(model, sizes, np.random.default_rng(5)).items()}, batch_file)
    return os.path.join(root, dm_file), ["--set", sizes, "--seed", "7", "--batch-file", batch_file]


def weight_matrices(weights):
    return sorted(name for name, w in weights.items() if w.ndim >= 2)


def same_zeros(tag, cuda, c):
    """The two runs' weight matrices: the same zeros but for MAX_MASK_DIFFERENCE of them, the
    rest within the tolerance; returns the worst fraction of differing zeros."""
    worst = 0.0
    for name in weight_matrices(c):
        differ = float(np.mean((cuda[name] == 0) != (c[name] == 0)))
        if differ > MAX_MASK_DIFFERENCE:
            raise Failure("%s: %s's zeros differ from the C target's at %.1f%% of positions" % (tag, name, 100 * differ))
        both = (cuda[name] != 0) & (c[name] != 0)
        if not np.allclose(cuda[name][both], c[name][both], rtol=VALUE_RTOL, atol=VALUE_ATOL):
            raise Failure("%s: %s differs from the C target's by up to %.3g" % (
                tag, name, float(np.max(np.abs(cuda[name][both] - c[name][both])))))
        worst = max(worst, differ)
    return worst


def l1_count(tag, weights):
    """Each weight matrix holds as many zeros as l1_unstructured prunes at RATIO: its
    amount, a fraction, is round(amount * numel) parameters (torch.nn.utils.prune)."""
    for name in weight_matrices(weights):
        count = int(round(RATIO * weights[name].size))
        zeros = int(np.sum(weights[name] == 0))
        if zeros != count:
            raise Failure("%s: %s holds %d zeros; l1_unstructured(amount=%g) prunes %d of its %d" % (
                tag, name, zeros, RATIO, count, weights[name].size))


def prune(dmc, root, tmp):
    worst = 0.0
    # gpt.dm's :rows prunes its attentions' heads together (dmrt_gpu_prune_heads)
    for model, how in (("mlp", "%g" % RATIO), ("mlp", "%g:rows" % RATIO), ("gpt", "%g:rows" % RATIO)):
        dm_file, common = mlp_files(root, tmp, model)
        saved = {}
        for target in ("c", "cuda"):
            saved[target] = os.path.join(tmp, "%s-%s-%s.safetensors" % (model, target, how.replace(":", "-")))
            dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--prune", how, "--prune-end", "1",
                                                 "--save", saved[target]], target)
        cuda, c = stio.load(saved["cuda"]), stio.load(saved["c"])
        worst = max(worst, same_zeros("%s --prune %s" % (model, how), cuda, c))
        if ":" not in how:
            l1_count("--prune " + how, cuda)
    return ("mlp (by elements and channels) and gpt (by heads): %d pruned steps on CUDA hold the C target's zeros (at "
            "most %.2f%% of positions differ) and, by elements, l1_unstructured's count of zeros" % (STEPS, 100 * worst))


def resume(dmc, root, tmp):
    dm_file, common = mlp_files(root, tmp)
    common += ["--prune", "%g" % RATIO]
    whole, resumed = os.path.join(tmp, "whole.safetensors"), os.path.join(tmp, "resumed.safetensors")
    ckpt = os.path.join(tmp, "ckpt")
    dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--save", whole], "cuda")
    # the schedule spans the run's steps: the checkpoint is one of a run of STEPS, mid-ramp
    dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--checkpoint", ckpt, "--checkpoint-every", "3"], "cuda")
    dmc_run(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--resume", os.path.join(ckpt, "step-00000003.safetensors"),
                                         "--save", resumed], "cuda")
    bitwise("pruned mlp resumed", stio.load(resumed), stio.load(whole))
    return "mlp: %d pruned CUDA steps and 3 + --resume + %d give bitwise the same weights" % (STEPS, STEPS - 3)


# (tag, student, classes, mesh options): the linear student serial and on data=2, the
# two-layer one split over tensor on data=2 x tensor=2 x pipeline=2 with 2 micro-batches
# (each rank's teacher on its rank's device: several ranks share one GPU, host-staged)
DISTILL_CASES = [("serial", distill.STUDENT, distill.K, []),
                 ("data=2", distill.STUDENT, distill.K, ["--mesh", "data=2"]),
                 ("data=2,tensor=2,pipeline=2", distill.MESH_STUDENT, 6,
                  ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "2"])]


def distill_losses(dmc, tmp, tag, student, classes, mesh):
    """4 steps' losses of a distilled student on the C target and on the CUDA one, the same
    mesh and seed; the worst relative difference."""
    b, d, h = distill.B, distill.D, distill.H
    name = tag.replace("=", "").replace(",", "_")
    files = {"student": distill.write(os.path.join(tmp, "student_%s.dm" % name), student),
             "teacher": distill.write(os.path.join(tmp, "teacher_%s.dm" % name),
                                      distill.TEACHER % (b, d, h, classes, "cross_entropy(logits, y)")),
             "tw": os.path.join(tmp, "tw_%s.safetensors" % name), "batch": os.path.join(tmp, "batch_%s.safetensors" % name)}
    rng = np.random.default_rng(7)
    stio.save({"w1": rng.standard_normal((d, h)).astype(np.float32),
               "w2": rng.standard_normal((h, classes)).astype(np.float32)}, files["tw"])
    stio.save({"x": rng.standard_normal((4, b, d)).astype(np.float32),
               "y": rng.integers(0, classes, (4, b)).astype(np.int32)}, files["batch"])
    losses = {}
    for target in ("c", "cuda"):
        out = dmc_run(dmc, files["student"], tmp, mesh + ["--seed", "3", "--teacher", files["teacher"], "--teacher-init",
                                                          files["tw"], "--batch-file", files["batch"], "--steps", "4"],
                      target)
        losses[target] = [float(line.split()[3]) for line in out.splitlines() if line.startswith("step ")]
    if len(losses["cuda"]) != 4 or len(losses["c"]) != 4:
        raise Failure("distill %s: step losses %r on CUDA, %r on C" % (tag, losses["cuda"], losses["c"]))
    worst = max(abs(g - w) / abs(w) for g, w in zip(losses["cuda"], losses["c"]))
    if worst > LOSS_RTOL:
        raise Failure("distill %s: CUDA losses %r, the C target's %r" % (tag, losses["cuda"], losses["c"]))
    return worst


def distill_run(dmc, tmp):
    worst = max(distill_losses(dmc, tmp, *case) for case in DISTILL_CASES)
    return "distillation (%s): 4 CUDA steps' losses within %.1e of the C target's on the same mesh (worst %.1e)" % (
        "; ".join(case[0] for case in DISTILL_CASES), LOSS_RTOL, worst)


def main(argv):
    checks = {"prune": prune, "resume": resume, "distill": lambda dmc, root, tmp: distill_run(dmc, tmp)}
    if len(argv) != 4 or argv[3] not in checks:
        sys.stderr.write("usage: %s DMC SRCROOT prune|resume|distill\n" % argv[0])
        return 2
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    return run_on_gpu(argv[3], lambda tmp: checks[argv[3]](dmc, root, tmp))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
