"""test_compress_fp16.py DMC SRCROOT BACKEND: gradient compression with error feedback
(--compress topk, powersgd) under --precision fp16's dynamic loss scaling, on data=2.

examples/mlp.dm (test_mlp.py's weights and 10 batches, B=16, H=64) trains on data=2:

  overflow   --loss-scale 2^26 --loss-scale-interval 4, 30 steps (test_fp16.py's case):
             the first steps overflow half and are skipped while the scale halves, then
             the scale grows every 4 clean steps until it overflows again. With topk:0.05
             and powersgd:2 every step's scale and skip must be the uncompressed run's
             (a skipped step reaches neither the residual nor Q, and a clean one is
             unscaled before compression), and the run must keep training: its last loss
             finite and below its first. Before the fix PowerSGD skipped every step from
             the first overflow on (NaN in its residual and Q for good) and top-k far more
             than the uncompressed run (its residual kept the infinities).
  topk:1     the same overflow run with every element sent: the uncompressed run's losses
             bit for bit (unscaling by a power of two before the sum is exact).
  scale      the residual holds unscaled gradients: 12 steps from scale 2^10 with the
             scale doubling every 2 clean steps (no overflow) follow the run whose scale
             stays 2^10 (losses within 1e-4 relative; a power-of-two scale only moves
             fp16's rounding of tiny values). A residual kept in scaled units is carried
             into the next step at twice its weight when the scale doubles: before the
             fix the losses were 3e-2 (top-k) and 6e-2 (PowerSGD) apart.
  interleaved the overflow run on data=2 x pipeline=2 with 2 chunks and 2 micro-batches,
             against data=2 accumulating the same 2 micro-batches: the same losses, scales
             and skips bit for bit (the rank checks every chunk's partials before any chunk
             compresses; a chunk that compressed before another's overflow was known would
             leave that step in its residual). The same with clip = 0.5 in the optimizer:
             the norm counts the gradients compression unscaled as scaled ones (their
             squares times the scale squared) before the rank divides by it; there the
             scales and skips are the same and the losses within 1e-4 relative, as the
             chunks' squares are summed in another order than one model's (3.8e-6 apart
             after 30 steps in the sanitized build, 0 in the optimised one; without the
             rescaled squares 3e-3).

docs/comm.md, "Under fp16 loss scaling". Exit 77 (a meson skip) without torch/numpy, or
for mpi without mpirun.
"""
import math
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import dmcrun  # noqa: E402
import test_mlp as mlp  # noqa: E402
from dmcrun import Failure, import_reference  # noqa: E402

MODES = ["topk:0.05", "powersgd:2"]
OVERFLOW = ["--loss-scale", "67108864", "--loss-scale-interval", "4", "--steps", "30"]
SCALE_STEPS = 12
SCALE_RTOL = 1e-4


INTERLEAVED = ["--mesh", "data=2,pipeline=2", "--microbatches", "2", "--schedule", "interleaved", "--chunks", "2"]
ACCUMULATED = ["--mesh", "data=2", "--accumulate", "2"]
CLIP_LINE = "optimizer adamw(lr = 1e-3, weight_decay = 1e-4, clip = 0.5)"


def steps(dmc, dm_file, tmp, backend, common, extra, mesh=("--mesh", "data=2")):
    """[(loss, scale, skipped)] of a data=2 fp16 run (mesh: its --mesh and schedule)."""
    args = ["--set", "B=%d,H=%d" % (mlp.B, mlp.H), "--precision", "fp16", "--backend", backend] + list(mesh)
    fields = dmcrun.run_dmc_steps(dmc, dm_file, tmp, args + extra + common + ["--seed", "1"], timeout=300)
    return [(f["loss"], f["scale"], f.get("skipped") == 1.0) for f in fields]


def describe(run):
    return " ".join("%g%s" % (s, "*" if k else "") for _, s, k in run)


def check_overflow(mode, got, plain):
    """The same scale and skip every step as the uncompressed run, and still training."""
    if [(s, k) for _, s, k in got] != [(s, k) for _, s, k in plain]:
        raise Failure("%s: scales (* skipped) %s; uncompressed %s" % (mode, describe(got), describe(plain)))
    first, last = got[0][0], got[-1][0]
    if not math.isfinite(last) or not last < first:
        raise Failure("%s: the last loss %r is not finite and below the first %r" % (mode, last, first))
    print("%-11s overflow: the uncompressed run's %d skips and scales; loss %.6f -> %.6f"
          % (mode, sum(k for _, _, k in got), first, last))


def check_scale_change(mode, fixed, moving):
    """A scale that doubles every 2 steps trains as a fixed one."""
    if any(k for _, _, k in fixed + moving):
        raise Failure("%s: a step was skipped in the scale runs: the case no longer avoids overflow" % mode)
    if moving[-1][1] <= fixed[-1][1]:
        raise Failure("%s: the scale did not grow (%g): the case no longer changes it" % (mode, moving[-1][1]))
    worst = max(dmcrun.nan_worst(abs(a - b) / abs(b)) for (a, _, _), (b, _, _) in zip(moving, fixed))
    print("%-11s scale 1024 -> %g: losses within %.2e of a fixed scale's (bound %.0e)"
          % (mode, moving[-1][1], worst, SCALE_RTOL))
    if worst > SCALE_RTOL:
        raise Failure("%s: with a changing scale the losses %s, with a fixed one %s"
                      % (mode, [l for l, _, _ in moving], [l for l, _, _ in fixed]))


def check_interleaved(dmc, dm_file, tmp, backend, common, mode, label, rtol=0.0):
    """Interleaved chunks as the accumulated micro-batches, skips and all: the losses bit for
    bit (rtol 0) or within rtol relative."""
    extra = OVERFLOW + ["--compress", mode]
    got = steps(dmc, dm_file, tmp, backend, common, extra, INTERLEAVED)
    want = steps(dmc, dm_file, tmp, backend, common, extra, ACCUMULATED)
    skips = sum(k for _, _, k in want)
    same_steps = [(s, k) for _, s, k in got] == [(s, k) for _, s, k in want]
    worst = max(dmcrun.nan_worst(abs(a - b) / abs(b)) for (a, _, _), (b, _, _) in zip(got, want)) if got else 1.0
    if not same_steps or len(got) != len(want) or worst > rtol or skips < 3:
        raise Failure("%s interleaved: %s; accumulated %s (%d skipped; losses %.2e apart, bound %.0e)"
                      % (label, got, want, skips, worst, rtol))
    print("%-11s interleaved%s: the accumulated run's scales and %d skips, losses %s"
          % (mode, " (clip)" if "clip" in label else "", skips,
             "bit for bit" if rtol == 0.0 else "within %.2e (bound %.0e)" % (worst, rtol)))


def run_checks(dmc, dm_file, tmp, backend, np, torch, src):
    _, _, _, common = mlp.write_data(np, torch, tmp)
    failures = []

    def attempt(label, check):
        try:
            check()
        except Failure as e:
            print("FAIL %s: %s" % (label, e))
            failures.append(label)

    plain = steps(dmc, dm_file, tmp, backend, common, OVERFLOW)
    skips = sum(k for _, _, k in plain)
    print("uncompressed overflow: %d of %d steps skipped: %s" % (skips, len(plain), describe(plain)))
    if skips < 3 or skips > len(plain) // 2:
        raise Failure("the uncompressed run skips %d steps: the case no longer tests skipping and growth" % skips)
    for mode in MODES:
        attempt(mode + " overflow", lambda: check_overflow(
            mode, steps(dmc, dm_file, tmp, backend, common, OVERFLOW + ["--compress", mode]), plain))

    def topk_all():
        got = steps(dmc, dm_file, tmp, backend, common, OVERFLOW + ["--compress", "topk:1"])
        if got != plain:
            raise Failure("topk:1 %s; uncompressed %s" % (got, plain))
        print("topk:1      overflow: the uncompressed run's losses, scales and skips bit for bit")
    attempt("topk:1", topk_all)

    clip_file = mlp.with_optimizer(src, CLIP_LINE, os.path.join(tmp, "clip"))
    for mode in MODES:
        attempt(mode + " interleaved", lambda: check_interleaved(dmc, dm_file, tmp, backend, common, mode, mode))
        attempt(mode + " interleaved clip",
                lambda: check_interleaved(dmc, clip_file, tmp, backend, common, mode, mode + " clip", SCALE_RTOL))

    scale = ["--loss-scale", "1024", "--steps", str(SCALE_STEPS)]
    for mode in MODES:
        attempt(mode + " scale", lambda: check_scale_change(
            mode, steps(dmc, dm_file, tmp, backend, common, scale + ["--loss-scale-interval", "100000", "--compress", mode]),
            steps(dmc, dm_file, tmp, backend, common, scale + ["--loss-scale-interval", "2", "--compress", mode])))
    return failures


def main():
    dmc, root, backend = sys.argv[1:4]
    if backend == "mpi" and not shutil.which("mpirun"):
        print("SKIP: mpirun is not installed")
        return 77
    dmcrun.require_target()
    mods = import_reference()
    if mods is None:
        return 77
    np, torch = mods
    dm_file, src, _ = mlp.example(os.path.abspath(root), "test_compress_fp16.py")
    tmp = tempfile.mkdtemp(prefix="dmc-compress-fp16-")
    try:
        failures = run_checks(dmc, dm_file, tmp, backend, np, torch, src)
    except Failure as e:
        print("FAIL %s" % e)
        failures = ["setup"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
