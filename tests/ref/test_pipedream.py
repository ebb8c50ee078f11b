#!/usr/bin/python3
"""test_pipedream.py: the pipedream schedule (PipeDream's weight stashing) against a PyTorch
reference of its update rule (meson test `ref-pipedream-pytorch`).

usage: /usr/bin/python3 tests/ref/test_pipedream.py DMC SOURCE_ROOT

PipeDream (Narayanan et al., 2019) does not compute what synchronous training computes, by
design. The micro-batches of consecutive steps are one stream, numbered i = 0, 1, ...
(step t's micro-batch m is i = t M + m). Stage s of P runs them 1F1B without a flush,
its backwards P - 1 - s micro-batches behind its forwards, and updates its parameters
after every backward, with that micro-batch's gradient alone (the mean over its rows).
The forward of micro-batch i on stage s runs on the weights of the updates made there
before it, max(0, i - (P - 1 - s)) of them, and its backward on the same (stashed)
weights. So, for the parameters W_s of stage s:

    g_i = gradient of micro-batch i's loss, each stage s at W_s(max(0, i - P + 1 + s))
    W_s(i + 1) = W_s(i) - opt(g_i restricted to stage s)

The reference is that rule written out in torch, independently of dmc: every version of
every parameter kept, one autograd graph per micro-batch with each stage's parameters at
its version, torch.optim.SGD/AdamW stepping the live weights once per micro-batch. Which
parameters are on which stage is the plan's (read from `dmc --explain=json`: each stage's
parameter bytes, the parameters in the order the model uses them). examples/mlp.dm at
test_mlp.py's sizes, weights and batches runs STEPS steps with `dmc run --schedule
pipedream` (the trainer drains the pipeline after the last step, so the --save'd weights
are W(STEPS M)) on each mesh of CASES:

  - every printed loss (the mean of the step's micro-batches' losses) within 1e-5 relative;
  - the final weights within 1e-5 (test_mlp.py's bound);
  - and, so that the test can fail, the reference's final weights differ from those of
    the 2bw rule and of synchronous training by far more than the bound;
  - a run's --trace (pipeline=2, M = 4, 3 steps) is the stream's order on each stage: no
    flush between steps (test_2bw.check_trace).

Tied parameters: tests/ref/tied2bw.dm (its head is the embedding transposed, held by the
first and the last stage, 1 to 3 stages apart) against the rule with the last stage's copy
at the owner's version for the same micro-batch and update i made with both uses' summed
gradient of micro-batch i (TIED_CASES).

The cases cover pipelines of 2 to 4 stages (1 to 3 micro-batches owed across a step's end,
and up to 4 weight versions), SGD with momentum and weight decay and AdamW (whose bias
correction counts updates), data parallelism (pipeline=2 x data=2) and the MPI backend.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
import test_2bw  # noqa: E402
import test_mlp  # noqa: E402
from dmcrun import Failure  # noqa: E402

# test_2bw's steps and bounds, and its margin for telling rules apart
STEPS, LOSS_RTOL, WEIGHT_ATOL, DISTINCT = test_2bw.STEPS, test_2bw.LOSS_RTOL, test_2bw.WEIGHT_ATOL, test_2bw.DISTINCT

# (label, mesh, micro-batches, optimizer: "sgd" or "adamw")
CASES = [
    ("p2-m4-sgd", "pipeline=2", 4, "sgd"),
    ("p2-m2-adamw", "pipeline=2", 2, "adamw"),
    ("p3-m4-adamw", "pipeline=3", 4, "adamw"),
    ("p4-m4-sgd", "pipeline=4", 4, "sgd"),
    ("p2xd2-m2-sgd", "data=2,pipeline=2", 2, "sgd"),
    ("p2-m4-adamw-mpi", "pipeline=2", 4, "adamw"),  # the MPI backend (the label's -mpi)
]


# a smaller rate than test_2bw's: M updates a step, at 0.05 the loss diverges on 4 stages
# and float rounding grows with it
SGD_LINE = "optimizer sgd(lr = 0.01, momentum = 0.9, weight_decay = 1e-3)"


def make_optimizer(torch, kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-3)
    return test_2bw.make_optimizer(torch, kind, params)


def stages_of(dmc, dm_file, mesh, micros, sets=None):
    """Each parameter's pipeline stage in dmc's plan (the one that updates it): the stages'
    parameter bytes, taken from the parameters in the order the model declares (and uses)
    them; sets: the model's dims (--set ...), test_mlp's by default."""
    sets = sets or ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)]
    out = subprocess.run([dmc, "--explain=json", dm_file] + sets + ["--mesh", mesh, "--microbatches", str(micros),
                                                                    "--schedule", "pipedream"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise Failure("dmc --explain=json failed: %s" % out.stderr)
    plan = json.loads(out.stdout)
    params = [(p["name"], 4 * p["elements"]) for p in plan["params"]]
    stage_of, k = {}, 0
    for s, st in enumerate(plan["pipeline"]["stage"]):
        left = st["param_bytes"]
        while left > 0 and k < len(params):
            stage_of[params[k][0]] = s
            left -= params[k][1]
            k += 1
        if left != 0:
            raise Failure("the plan's stage %d holds %d parameter bytes that are not whole parameters"
                          % (s, st["param_bytes"]))
    if k != len(params):
        raise Failure("the plan's stages hold %d of %d parameters" % (k, len(params)))
    return stage_of, len(plan["pipeline"]["stage"])


def stashed_train(torch, init, make_opt, steps, micros, stage_of, stages, micro_loss, tied=None, drains=()):
    """PipeDream's rule from weights init (a dict of arrays): micro-batch i (step t's m:
    micro_loss(w, t, m)) on each parameter's stage's version, max(0, i - (P - 1 -
    stage_of[n])) updates old; an update per micro-batch. tied: the name of a parameter
    a later stage holds a copy of, at the owner's version for the same micro-batch (its
    copies follow the owner's versions): micro_loss gets it as w["(copy)"], a tensor of its
    own, and update i is made with both uses' summed gradient. drains: the steps after
    which the pipeline is drained (a checkpoint's): the stream starts again, its first
    micro-batch j on the weights of the updates before it and max(0, j - (P - 1 - s)) since.
    Returns (each step's mean loss, final weights as float64 arrays)."""
    names = sorted(init)
    live = {n: torch.tensor(init[n], dtype=torch.float32, requires_grad=True) for n in names}
    opt = make_opt([live[n] for n in names])
    history = {n: [live[n].detach().clone()] for n in names}  # history[n][k]: after k updates
    losses, start = [], 0  # start: the micro-batch the stream (re)started at
    for i in range(steps * micros):
        t, m = divmod(i, micros)
        if m == 0 and t in drains:
            start = i
        w = {n: history[n][start + max(0, i - start - (stages - 1 - stage_of[n]))].clone().requires_grad_(True)
             for n in names}
        if tied:
            w["(copy)"] = history[tied][start + max(0, i - start - (stages - 1 - stage_of[tied]))].clone().requires_grad_(True)
        loss = micro_loss(w, t, m)
        loss.backward()
        if m == 0:
            losses.append(0.0)
        losses[-1] += loss.item() / micros
        for n in names:
            live[n].grad = w[n].grad + w["(copy)"].grad if n == tied else w[n].grad
        opt.step()
        for n in names:
            history[n].append(live[n].detach().clone())
    return losses, {n: live[n].detach().double().numpy() for n in names}


def reference(torch, init, xs, ys, kind, steps, micros, stage_of, stages, norm, drains=()):
    """examples/mlp.dm under PipeDream's rule: (each step's mean loss, final weights).
    Micro-batch m of a batch is its rows m B / M .. (m + 1) B / M - 1 (with a data axis too:
    the ranks split each micro-batch, and the gradient is the mean over all its rows)."""
    rows = len(xs[0]) // micros

    def micro_loss(w, t, m):
        x = torch.tensor(xs[t][m * rows:(m + 1) * rows])
        y = torch.tensor(ys[t][m * rows:(m + 1) * rows], dtype=torch.int64)
        return test_2bw.mlp_loss(torch, w, x, y, norm)
    return stashed_train(torch, init, lambda ps: make_optimizer(torch, kind, ps), steps, micros, stage_of, stages,
                         micro_loss, drains=drains)


def distinct_from_others(np, torch, init, xs, ys, kind, norm, final, label):
    """The rule must end far from 2bw's and synchronous training's, or the test could not
    tell them apart."""
    def loss_of(w, t):
        return test_2bw.mlp_loss(torch, w, torch.tensor(xs[t]), torch.tensor(ys[t], dtype=torch.int64), norm)
    for stale, what in ((True, "2bw"), (False, "synchronous")):
        _, other = test_2bw.train(torch, init, loss_of, lambda ps: make_optimizer(torch, kind, ps), STEPS, stale)
        apart = max(float(np.max(np.abs(final[n] - other[n]))) for n in final)
        print("%-16s pipedream vs %s reference weights: max difference %.3g (must exceed %.0e)"
              % (label, what, apart, DISTINCT))
        if apart <= DISTINCT:
            raise Failure("%s: the pipedream rule and %s training end %.3g apart: the test would not tell them "
                          "apart" % (label, what, apart))


# tests/ref/tied2bw.dm: its embedding's copies on the first and the last stage (its SGD),
# neighbouring or two and three stages apart
TIED_CASES = [("tied-p2-m4", "pipeline=2", 4), ("tied-p2-m2", "pipeline=2", 2),
              ("tied-p2xd2-m2", "data=2,pipeline=2", 2), ("tied-p3-m4", "pipeline=3", 4),
              ("tied-p3-m8", "pipeline=3", 8), ("tied-p4-m4", "pipeline=4", 4),
              ("tied-p3xd2-m4", "data=2,pipeline=3", 4)]


def tied_reference(torch, init, toks, tgts, micros, stage_of, stages):
    """tied2bw.dm under PipeDream's rule with a tied weight: the embedding (stage 0) and the
    head (the last stage, which holds a copy) both read the owner's version of wte for
    micro-batch i, the one after max(0, i - (P - 1)) updates; update i is made with the sum
    of the two uses' gradients. w1, w2 at their stage's version (stage_of: the plan's)."""
    rows = len(toks[0]) // micros

    def micro_loss(w, t, m):
        tok = torch.tensor(toks[t][m * rows:(m + 1) * rows], dtype=torch.int64)
        tgt = torch.tensor(tgts[t][m * rows:(m + 1) * rows], dtype=torch.int64)
        return test_2bw.tied_loss(torch, w, tok, tgt, w["(copy)"])
    return stashed_train(torch, init, lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.5), STEPS, micros, stage_of,
                         stages, micro_loss, "wte")


def check_tied(np, torch, stio, dmc, root, tmp):
    """tied2bw.dm's cases against tied_reference: losses and final weights."""
    init, toks, tgts, (init_path, batch_path) = test_2bw.embed_data(np, tmp, True)
    model = os.path.join(root, "tests", "ref", "tied2bw.dm")
    for label, mesh, micros in TIED_CASES:
        stage_of, stages = stages_of(dmc, model, mesh, micros, ["--set", "B=%d" % test_2bw.EMBED["B"]])
        if stage_of["wte"] != 0:
            raise Failure("%s: the plan updates wte on stage %d, not the first" % (label, stage_of["wte"]))
        want, final = tied_reference(torch, init, toks, tgts, micros, stage_of, stages)
        out = os.path.join(tmp, label + ".safetensors")
        got = dmcrun.run_dmc(dmc, model, tmp,
                             ["--init", init_path, "--batch-file", batch_path, "--mesh", mesh, "--microbatches",
                              str(micros), "--schedule", "pipedream", "--steps", str(STEPS), "--save", out],
                             timeout=240)
        dmcrun.check_losses(label, got, want, LOSS_RTOL)
        test_2bw.check_weights(np, label, stio.load(out), final)


def run_checks(dmc, root, np, torch):
    import stio
    src_path, src, norm = test_mlp.example(root, "test_pipedream.py")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-pipedream-") as tmp:
        init, xs, ys, common = test_mlp.write_data(np, torch, tmp)
        files = {"sgd": test_mlp.with_optimizer(src, SGD_LINE, os.path.join(tmp, "sgd")), "adamw": src_path}
        checked = set()
        for label, mesh, micros, kind in CASES:
            stage_of, stages = stages_of(dmc, files[kind], mesh, micros)
            want, final = reference(torch, init, xs, ys, kind, STEPS, micros, stage_of, stages, norm)
            if kind not in checked:
                distinct_from_others(np, torch, init, xs, ys, kind, norm, final, label)
                checked.add(kind)
            out = os.path.join(tmp, label + ".safetensors")
            got = test_mlp.run_dmc(dmc, files[kind], tmp, test_2bw.schedule_args(common, label, mesh, micros,
                                                                                  "pipedream", out))
            dmcrun.check_losses(label, got, want, LOSS_RTOL)
            test_mlp.check_tensors(np, label, stio.load(out), final, WEIGHT_ATOL, 0.0)
        check_tied(np, torch, stio, dmc, root, tmp)
        test_2bw.check_trace(dmc, tmp, common, files, "pipedream")

        def want_of(kind, mesh, micros, drains):
            stage_of, stages = stages_of(dmc, files[kind], mesh, micros)
            return reference(torch, init, xs, ys, kind, STEPS, micros, stage_of, stages, norm, drains)[1]
        test_2bw.check_checkpoints(dmc, tmp, np, stio, common, files, "pipedream", want_of)
    return "the pipedream schedule follows PipeDream's weight-stashing rule (PyTorch) on %d meshes, %d steps" % (
        len(CASES) + len(TIED_CASES), STEPS)


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
