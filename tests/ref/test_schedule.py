#!/usr/bin/python3
"""test_schedule.py: learning-rate schedules and gradient clipping against PyTorch
(meson test `ref-schedule-pytorch`).

usage: /usr/bin/python3 tests/ref/test_schedule.py DMC SOURCE_ROOT

examples/mlp.dm at test_mlp.py's sizes, weights and batches, its optimizer line replaced
by each of CASES, trained STEPS steps with `dmc run --steps STEPS` (so the run's total N
is STEPS), against the float32 torch mirror of test_mlp.py with torch.optim.SGD/AdamW,
torch.optim.lr_scheduler.LambdaLR and torch.nn.utils.clip_grad_norm_ (after backward,
before the update; the scheduler stepped after it). LambdaLR's epoch e is the (e+1)-th
update, so its factor is schedule(e + 1) / lr with the formulas of docs/language.md.

Checked: every step's printed `lr` equals the scheduler's (relative 1e-8: the trainer
prints 9 digits of the same double formula); losses and final weights within test_mlp.py's bounds (losses 1e-5
relative, weights 1e-5 absolute, see its docstring for why). Each clip case also asserts
what it is for: in CLIPS the torch norm exceeds clip at every step (clipping acts), in the
other case never (the run must equal the unclipped one); else the case tests nothing.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
import stio  # noqa: E402
import test_mlp  # noqa: E402
from dmcrun import Failure  # noqa: E402

STEPS = test_mlp.STEPS
LR_RTOL = 1e-8  # the trainer prints %.9g


def schedule(lr, warmup=0, decay="none", min_lr=0.0, total=STEPS):
    """The learning rate of update s (from 1): docs/language.md, "Schedules and clipping"."""
    def at(s):
        if s <= warmup:
            return lr * s / warmup
        if decay == "none":
            return lr
        if s >= total:
            return min_lr
        progress = (s - warmup) / (total - warmup)
        if decay == "cosine":
            return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2
        return min_lr + (lr - min_lr) * (1 - progress)
    return at


def cases(torch):
    """(label, optimizer line, torch optimizer factory, learning rate of update s, clip,
    whether clipping must act: True at every step, False at none, None: no clip)."""
    SGD, AdamW = torch.optim.SGD, torch.optim.AdamW
    return [
        ("adamw-cosine", "optimizer adamw(lr = 2e-3, weight_decay = 1e-4, warmup = 3, decay = cosine, min_lr = 2e-4)",
         lambda ps: AdamW(ps, lr=2e-3, weight_decay=1e-4), schedule(2e-3, 3, "cosine", 2e-4), None, None),
        ("sgd-linear", "optimizer sgd(lr = 0.05, momentum = 0.9, weight_decay = 1e-3, warmup = 4, decay = linear, min_lr = 0.005)",
         lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3), schedule(0.05, 4, "linear", 0.005), None, None),
        # warmup, then constant
        ("sgd-warmup", "optimizer sgd(lr = 0.05, warmup = 5)",
         lambda ps: SGD(ps, lr=0.05), schedule(0.05, 5), None, None),
        # SGD moves the weights by the clipped gradient itself: a wrong norm shows at once
        ("sgd-clip", "optimizer sgd(lr = 0.05, momentum = 0.9, warmup = 2, decay = cosine, clip = 0.2)",
         lambda ps: SGD(ps, lr=0.05, momentum=0.9), schedule(0.05, 2, "cosine"), 0.2, True),
        ("adamw-clip", "optimizer adamw(lr = 1e-3, weight_decay = 1e-4, warmup = 2, decay = linear, min_lr = 1e-4, clip = 0.2)",
         lambda ps: AdamW(ps, lr=1e-3, weight_decay=1e-4), schedule(1e-3, 2, "linear", 1e-4), 0.2, True),
        # a clip the norm never reaches changes nothing
        ("adamw-noclip", "optimizer adamw(lr = 1e-3, weight_decay = 1e-4, clip = 100)",
         lambda ps: AdamW(ps, lr=1e-3, weight_decay=1e-4), schedule(1e-3), 100.0, False),
    ]


def check_lrs(label, steps, want):
    got = [s.get("lr") for s in steps]
    if None in got:
        raise Failure("%s: a step line has no lr field: %s" % (label, got))
    worst = max(abs(g - w) / w if w else abs(g) for g, w in zip(got, want))
    print("%-12s lr: %s; max rel error %.3g" % (label, ", ".join("%.4g" % v for v in got), worst))
    if len(got) != len(want) or worst > LR_RTOL:
        raise Failure("%s: learning rates %s, torch's %s" % (label, got, want))


def check_clipping(label, trace, clip, acts):
    norms = [n for _, n in trace]
    print("%-12s torch gradient norms %s (clip %g)" % (label, ", ".join("%.3g" % n for n in norms), clip))
    if acts and min(norms) <= clip:
        raise Failure("%s: the norm is below clip = %g at some step: the case no longer tests clipping" % (label, clip))
    if not acts and max(norms) >= clip:
        raise Failure("%s: the norm reaches clip = %g: the case no longer tests an idle clip" % (label, clip))


def run_case(np, torch, dmc, src, tmp, common, init, xs, ys, norm, case):
    label, line, make_opt, lr_at, clip, acts = case
    base_lr = make_opt([torch.zeros(1, requires_grad=True)]).param_groups[0]["lr"]
    make_sched = lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda e: lr_at(e + 1) / base_lr)  # noqa: E731
    dm_file = test_mlp.with_optimizer(src, line, os.path.join(tmp, label))
    out = os.path.join(tmp, label + ".safetensors")
    steps = dmcrun.run_dmc_steps(dmc, dm_file, tmp, ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)] + common
                                 + ["--steps", str(STEPS), "--save", out], timeout=240)
    trace = []
    t_losses, _, t_final = test_mlp.torch_run(torch, init, xs, ys, make_opt, STEPS, torch.float32, norm,
                                              make_sched, clip, trace)
    _, _, t_final64 = test_mlp.torch_run(torch, init, xs, ys, make_opt, STEPS, torch.float64, norm, make_sched, clip)
    check_lrs(label, steps, [lr for lr, _ in trace])
    if clip:
        check_clipping(label, trace, clip, acts)
    test_mlp.check_losses(label, [s["loss"] for s in steps], t_losses)
    test_mlp.check_tensors(np, label, stio.load(out), t_final, test_mlp.WEIGHT_ATOL, 0.0, t_final64)


def run_checks(dmc, root, np, torch):
    torch.manual_seed(0)
    _, src, norm = test_mlp.example(root, "test_schedule.py")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-schedule-") as tmp:
        init, xs, ys, common = test_mlp.write_data(np, torch, tmp)
        for case in cases(torch):
            run_case(np, torch, dmc, src, tmp, common, init, xs, ys, norm, case)
    return "schedules (warmup, cosine, linear) and clipping (acting and idle) match PyTorch over %d steps" % STEPS


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
