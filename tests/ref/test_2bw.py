#!/usr/bin/python3
"""test_2bw.py: the 2bw schedule (PipeDream-2BW) against a PyTorch reference of its update
rule (meson test `ref-2bw-pytorch`).

usage: /usr/bin/python3 tests/ref/test_2bw.py DMC SOURCE_ROOT

2BW does not compute what synchronous training computes, by design: batch t's gradient is
taken at the weights one update old, W(t+1) = W(t) - opt(grad of batch t at W(t - 1)),
W(-1) = W(0) (the optimizer's state advances as usual, with that stale gradient). The
reference here is that rule written out in torch, independently of dmc: two copies of the
weights, the optimizer stepping the live one with the gradient computed on the copy one
update old. examples/mlp.dm at test_mlp.py's sizes, weights and batches runs STEPS steps
with `dmc run --schedule 2bw` (the trainer drains the pipeline after the last step, so the
--save'd weights are W(STEPS)) on each mesh of CASES, with SGD (momentum, weight decay)
and AdamW:

  - every printed loss (batch t's, at W(t - 1)) within 1e-5 relative of the reference's;
  - the final weights within 1e-5 (test_mlp.py's bound, and its reasons: float32 sums in
    other orders);
  - and, so that the test can fail, the reference's final weights differ from synchronous
    training's (the same run with fresh gradients) by far more than the bound: a schedule
    that flushed every step would fail it.

tests/ref/embed2bw.dm (a token embedding, a hidden layer, an untied head; SGD with
momentum) the same on pipeline=2 and 3 (M = 4): there the first stage's owed backwards read
the previous batch's token ids, which the step keeps. The cases cover one to three micro-batches owed per stage (pipeline=2, 3 and 4), micro-batch
counts that are and are not multiples of a stage's copies of kept values (M = 4 on 3
stages: copies are chosen by a micro-batch's place in the stream), and data parallelism
(pipeline=2 x data=2, threads backend; pipeline=2 also on MPI).

tests/ref/tied2bw.dm (the same embedding, two hidden layers and a head that is the
embedding transposed: a tied parameter, held by the first and the last stage) the same on
pipeline=2 (M = 2), pipeline=3 (M = 4) and data=2 x pipeline=2 (M = 2), against the rule
with one tensor read twice (its gradient the sum of both uses'): the last stage's copy must
be at its stage's version, updated with the owner's summed gradient, or the losses differ.

Gradient clipping (CASES' -clip: SGD with clip = 0.05, which acts on most steps, on
pipeline=3, data=2 x pipeline=2 and pipeline=2 on MPI) against the rule with
torch.nn.utils.clip_grad_norm_ applied to each stale gradient before its update: the norm
spans every stage's and rank's gradients of the batch. fp16's loss scaler (FP16_MESHES):
a run whose first updates are skipped (the scale overflowing) as the run without those
batches, losses and weights bit for bit (check_fp16 says why that is the rule).

Checkpoints (CHECKPOINT_CASES): a checkpoint drains the pipeline first, so a run
checkpointed every 5 of 10 steps has the rule's weights with a drain after step 5 (the
next batch on the newest weights), which end far from the undrained rule's; the run
resumed from the step-5 checkpoint ends with its weights bit for bit (check_checkpoints,
which test_pipedream.py runs for its schedule too).

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
import test_mlp  # noqa: E402
from dmcrun import Failure  # noqa: E402

STEPS = test_mlp.STEPS
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
# how far apart 2BW's and synchronous training's weights must be for the comparison to
# tell them apart: 100 times the bound
DISTINCT = 100 * WEIGHT_ATOL

# (label, mesh, micro-batches, optimizer: "sgd" or "adamw")
CASES = [
    ("p2-m2-sgd", "pipeline=2", 2, "sgd"),
    ("p2-m4-adamw", "pipeline=2", 4, "adamw"),
    ("p3-m4-sgd", "pipeline=3", 4, "sgd"),
    ("p4-m4-adamw", "pipeline=4", 4, "adamw"),
    ("p2xd2-m2-adamw", "data=2,pipeline=2", 2, "adamw"),
    ("p2-m4-adamw-mpi", "pipeline=2", 4, "adamw"),  # the MPI backend (the label's -mpi)
    # gradient clipping: the norm of batch t-1's gradients over every stage (and data rank),
    # agreed where each stage makes its update
    ("p3-m4-clip", "pipeline=3", 4, "clip"),
    ("p2xd2-m2-clip", "data=2,pipeline=2", 2, "clip"),
    ("p2-m2-clip-mpi", "pipeline=2", 2, "clip"),
]
SGD_LINE = "optimizer sgd(lr = 0.05, momentum = 0.9, weight_decay = 1e-3)"
CLIP = 0.05  # below the gradients' norm on most steps: the clipping acts
CLIP_LINE = "optimizer sgd(lr = 0.05, momentum = 0.9, weight_decay = 1e-3, clip = %g)" % CLIP


def make_optimizer(torch, kind, params):
    if kind in ("sgd", "clip"):
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3)
    return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)


def mlp_loss(torch, w, x, y, norm):
    """examples/mlp.dm's loss on one batch with weights w (a dict of tensors)."""
    import torch.nn.functional as F
    if norm:
        x = (x - torch.tensor(norm[0], dtype=torch.float32)) / torch.tensor(norm[1], dtype=torch.float32)
    h1 = torch.relu(x @ w["fc1.weight"] + w["fc1.bias"])
    h2 = torch.relu(h1 @ w["fc2.weight"] + w["fc2.bias"])
    return F.cross_entropy(h2 @ w["fc3.weight"] + w["fc3.bias"], y)


def train(torch, init, loss_of, make_opt, steps, stale=True, clip=None, drains=()):
    """The 2BW rule (stale=True) or synchronous training from weights init (a dict of
    arrays): loss_of(w, t) is batch t's loss at weights w; make_opt(params) the optimizer;
    clip: the gradients clipped to that norm first (torch's clip_grad_norm_); drains: the
    steps after which the pipeline is drained (a checkpoint's), the next batch then running
    on the newest weights, as the first does. Returns (losses, final weights as float64
    arrays)."""
    names = sorted(init)
    live = {n: torch.tensor(init[n], dtype=torch.float32, requires_grad=True) for n in names}  # W(t)
    opt = make_opt([live[n] for n in names])
    older = {n: live[n].detach().clone() for n in names}  # W(t - 1); W(-1) = W(0)
    losses = []
    for t in range(steps):
        if t in drains:
            older = {n: live[n].detach().clone() for n in names}
        at = older if stale else {n: live[n].detach() for n in names}
        w = {n: at[n].clone().requires_grad_(True) for n in names}
        loss = loss_of(w, t)
        loss.backward()
        losses.append(loss.item())
        older = {n: live[n].detach().clone() for n in names}
        for n in names:
            live[n].grad = w[n].grad
        if clip:
            torch.nn.utils.clip_grad_norm_([live[n] for n in names], clip)
        opt.step()
    return losses, {n: live[n].detach().double().numpy() for n in names}


def reference(torch, init, xs, ys, kind, steps, norm, stale=True, drains=()):
    """examples/mlp.dm under the 2BW rule (or synchronous): (losses, final weights)."""
    def loss_of(w, t):
        return mlp_loss(torch, w, torch.tensor(xs[t]), torch.tensor(ys[t], dtype=torch.int64), norm)
    return train(torch, init, loss_of, lambda ps: make_optimizer(torch, kind, ps), steps, stale,
                 CLIP if kind == "clip" else None, drains)


# checkpoints: written every CHECKPOINT_EVERY steps, each draining the pipeline first
CHECKPOINT_EVERY = 5
CHECKPOINT_CASES = [("ckpt-p2-m2-adamw", "pipeline=2", 2, "adamw"), ("ckpt-p2xd2-m2-sgd", "data=2,pipeline=2", 2, "sgd")]


def check_checkpoints(dmc, tmp, np, stio, common, files, schedule, want_of):
    """A schedule that does not flush, checkpointed every CHECKPOINT_EVERY of STEPS steps:
    each checkpoint drains the pipeline first, so the run's weights are the rule's with a
    drain there (want_of(kind, mesh, micros, drains): the reference's final weights), far
    from the rule's without one (or the check could not tell); and the run resumed from the
    first checkpoint ends with its weights bit for bit."""
    for label, mesh, micros, kind in CHECKPOINT_CASES:
        ckpt, out = os.path.join(tmp, label), os.path.join(tmp, label + ".safetensors")
        args = schedule_args(common, label, mesh, micros, schedule, out)
        test_mlp.run_dmc(dmc, files[kind], tmp, args + ["--checkpoint", ckpt, "--checkpoint-every", str(CHECKPOINT_EVERY)])
        drained = want_of(kind, mesh, micros, (CHECKPOINT_EVERY,))
        undrained = want_of(kind, mesh, micros, ())
        apart = max(float(np.max(np.abs(drained[n] - undrained[n]))) for n in drained)
        if apart <= DISTINCT:
            raise Failure("%s: the rule with and without a drain after step %d ends %.3g apart: the check would not "
                          "tell them apart" % (label, CHECKPOINT_EVERY, apart))
        written = stio.load(out)
        test_mlp.check_tensors(np, label + " checkpointed", written, drained, WEIGHT_ATOL, 0.0)
        first = os.path.join(ckpt, "step-%08d.safetensors" % CHECKPOINT_EVERY)
        if not os.path.exists(first):
            raise Failure("%s: no %s (a checkpoint is named after the updates done, the drain's included)" % (label, first))
        again = os.path.join(tmp, label + "-resumed")
        os.makedirs(again)
        os.link(first, os.path.join(again, os.path.basename(first)))
        resumed_out = out + ".resumed"
        at = common.index("--init")
        resume_args = common[:at] + common[at + 2:] + ["--resume", again]
        dmcrun.run_dmc_steps(dmc, files[kind], tmp, ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H)] +
                             schedule_args(resume_args, label, mesh, micros, schedule, resumed_out), timeout=240,
                             first_step=CHECKPOINT_EVERY + 1)
        resumed = stio.load(resumed_out)
        for n in written:
            if not np.array_equal(written[n], resumed[n]):
                raise Failure("%s: resumed from step %d, %s differs from the uninterrupted run's by %.3g"
                              % (label, CHECKPOINT_EVERY, n, float(np.max(np.abs(written[n] - resumed[n])))))
        print("%-22s checkpointed every %d steps: the rule drained there (it ends %.3g from the undrained rule); "
              "resumed bit for bit" % (label, CHECKPOINT_EVERY, apart))


EMBED = {"B": 16, "T": 4, "V": 32, "C": 16}
EMBED_CASES = [("embed-p2-m4", "pipeline=2", 4), ("embed-p3-m4", "pipeline=3", 4)]
# tied2bw.dm: the embedding's copies on the first and last stage
TIED_CASES = [("tied-p2-m2", "pipeline=2", 2), ("tied-p3-m4", "pipeline=3", 4), ("tied-p2xd2-m2", "data=2,pipeline=2", 2)]


def embed_loss(torch, w, tokens, targets):
    """tests/ref/embed2bw.dm's loss."""
    import torch.nn.functional as F
    logits = torch.tanh(w["wte"][tokens] @ w["w1"]) @ w["head"]
    return F.cross_entropy(logits.reshape(-1, EMBED["V"]), targets.reshape(-1))


def tied_loss(torch, w, tokens, targets, head=None):
    """tests/ref/tied2bw.dm's loss: its head is the embedding transposed (`head`: the copy
    the head reads, when it is not w["wte"] itself)."""
    import torch.nn.functional as F
    head = w["wte"] if head is None else head
    logits = torch.tanh(torch.tanh(w["wte"][tokens] @ w["w1"]) @ w["w2"]) @ head.t()
    return F.cross_entropy(logits.reshape(-1, EMBED["V"]), targets.reshape(-1))


def embed_data(np, tmp, tied):
    """embed2bw.dm's (or tied2bw.dm's) initial weights and STEPS batches, written to tmp:
    (init, tokens, targets, the files' paths)."""
    B, T, V, C = EMBED["B"], EMBED["T"], EMBED["V"], EMBED["C"]
    rng = np.random.default_rng(99)
    init = {"wte": rng.normal(0, 0.5, (V, C)).astype(np.float32),
            "w1": rng.uniform(-0.4, 0.4, (C, C)).astype(np.float32)}
    if tied:
        init["w2"] = rng.uniform(-0.4, 0.4, (C, C)).astype(np.float32)
    else:
        init["head"] = rng.uniform(-0.4, 0.4, (C, V)).astype(np.float32)
    toks = rng.integers(0, V, (STEPS, B, T)).astype(np.int32)
    tgts = rng.integers(0, V, (STEPS, B, T)).astype(np.int32)
    stem = "tied" if tied else "embed"
    paths = (os.path.join(tmp, stem + "-init.safetensors"), os.path.join(tmp, stem + "-batches.safetensors"))
    import stio
    stio.save(init, paths[0])
    stio.save({"tokens": toks, "targets": tgts}, paths[1])
    return init, toks, tgts, paths


def embed_reference(torch, init, toks, tgts, steps, tied=False, stale=True):
    """The 2BW rule (or, stale False, synchronous training) on embed2bw.dm or tied2bw.dm,
    with its SGD (lr 0.5, momentum 0.5). Tied: one tensor read by the embedding and the
    head, whose gradient is the sum of the two uses' (autograd's)."""
    loss = tied_loss if tied else embed_loss

    def loss_of(w, t):
        return loss(torch, w, torch.tensor(toks[t], dtype=torch.int64), torch.tensor(tgts[t], dtype=torch.int64))
    return train(torch, init, loss_of, lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.5), steps, stale)


def check_weights(np, label, saved, final):
    """Every weight of `final` in `saved` (a --save'd file) within WEIGHT_ATOL."""
    for n in sorted(final):
        err = float(np.max(np.abs(saved[n].astype(np.float64) - final[n])))
        print("%-14s %-10s max abs error %.3g" % (label, n, err))
        if not err <= WEIGHT_ATOL:
            raise Failure("%s: %s differs from the reference by %.3g > %.0e" % (label, n, err, WEIGHT_ATOL))


def check_embed(np, torch, stio, dmc, root, tmp, tied=False):
    """embed2bw.dm's cases (tied: tied2bw.dm's): losses and final weights against
    embed_reference."""
    init, toks, tgts, (init_path, batch_path) = embed_data(np, tmp, tied)
    want, final = embed_reference(torch, init, toks, tgts, STEPS, tied)
    if tied:
        _, fresh = embed_reference(torch, init, toks, tgts, STEPS, tied, stale=False)
        apart = max(float(np.max(np.abs(final[n] - fresh[n]))) for n in final)
        print("tied 2bw vs synchronous reference weights: max difference %.3g (must exceed %.0e)" % (apart, DISTINCT))
        if apart <= DISTINCT:
            raise Failure("tied: the 2bw rule and synchronous training end %.3g apart" % apart)
    for label, mesh, micros in TIED_CASES if tied else EMBED_CASES:
        out = os.path.join(tmp, label + ".safetensors")
        model = os.path.join(root, "tests", "ref", "tied2bw.dm" if tied else "embed2bw.dm")
        got = dmcrun.run_dmc(dmc, model, tmp,
                             ["--init", init_path, "--batch-file", batch_path, "--mesh", mesh, "--microbatches",
                              str(micros), "--schedule", "2bw", "--steps", str(STEPS), "--save", out], timeout=240)
        dmcrun.check_losses(label, got, want, LOSS_RTOL)
        check_weights(np, label, stio.load(out), final)


def stream_order(stages, stage, micros, first_step):
    """Stage `stage`'s actions in one step of the 2bw stream, by the rule: for each m the
    forward of micro-batch m, then the backward P - 1 - stage micro-batches behind it (of
    the previous batch when that index is negative; none in the first step)."""
    lag, names = stages - 1 - stage, []
    for m in range(micros):
        names.append("F%d" % m)
        if m - lag >= 0 or not first_step:
            names.append("B%d" % ((m - lag) % micros))
    return names


def check_trace(dmc, tmp, common, files, schedule="2bw"):
    """The run's trace: no flush between steps. A steady step on stage 0 starts with the
    previous batch's last backwards between its first forwards, as the stream's order says
    (the same for the pipedream schedule)."""
    stages, micros, steps = 2, 4, 3
    trace = os.path.join(tmp, schedule + "-trace.json")
    test_mlp.run_dmc(dmc, files["adamw"], tmp, common + ["--mesh", "pipeline=%d" % stages, "--microbatches",
                                                          str(micros), "--schedule", schedule, "--steps", str(steps),
                                                          "--trace", trace])
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    for stage in range(stages):
        for step in range(1, steps + 1):
            got = [e["name"] for e in sorted(events, key=lambda e: e["ts"])
                   if e["tid"] == stage and e["args"]["step"] == step]
            want = stream_order(stages, stage, micros, step == 1)
            print("trace stage %d step %d: %s (the stream: %s)" % (stage, step, " ".join(got), " ".join(want)))
            if got != want:
                raise Failure("trace: stage %d's step %d ran %s, not the %s stream's %s" % (stage, step, got, schedule,
                                                                                            want))


def run_checks(dmc, root, np, torch):
    import stio
    src_path, src, norm = test_mlp.example(root, "test_2bw.py")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-2bw-") as tmp:
        init, xs, ys, common = test_mlp.write_data(np, torch, tmp)
        files = {"sgd": test_mlp.with_optimizer(src, SGD_LINE, os.path.join(tmp, "sgd")), "adamw": src_path,
                 "clip": test_mlp.with_optimizer(src, CLIP_LINE, os.path.join(tmp, "clip"))}
        _, clipped = reference(torch, init, xs, ys, "clip", STEPS, norm)
        _, unclipped = reference(torch, init, xs, ys, "sgd", STEPS, norm)
        apart = max(float(np.max(np.abs(clipped[n] - unclipped[n]))) for n in clipped)
        if apart <= DISTINCT:
            raise Failure("clip %g: the clipped and unclipped 2bw rules end %.3g apart: the clip does not act" % (CLIP, apart))
        for kind in ("sgd", "adamw"):
            _, stale = reference(torch, init, xs, ys, kind, STEPS, norm)
            _, fresh = reference(torch, init, xs, ys, kind, STEPS, norm, stale=False)
            apart = max(float(np.max(np.abs(stale[n] - fresh[n]))) for n in stale)
            print("%-5s 2bw vs synchronous reference weights: max difference %.3g (must exceed %.0e)"
                  % (kind, apart, DISTINCT))
            if apart <= DISTINCT:
                raise Failure("%s: the 2bw rule and synchronous training end %.3g apart: the test would not "
                              "tell them apart" % (kind, apart))
        for label, mesh, micros, kind in CASES:
            out = os.path.join(tmp, label + ".safetensors")
            got = test_mlp.run_dmc(dmc, files[kind], tmp, schedule_args(common, label, mesh, micros, "2bw", out))
            want, final = reference(torch, init, xs, ys, kind, STEPS, norm)
            dmcrun.check_losses(label, got, want, LOSS_RTOL)
            test_mlp.check_tensors(np, label, stio.load(out), final, WEIGHT_ATOL, 0.0)
        check_fp16(dmc, tmp, np, stio, src_path, common[1], xs, ys)
        check_embed(np, torch, stio, dmc, root, tmp)
        check_embed(np, torch, stio, dmc, root, tmp, tied=True)
        check_trace(dmc, tmp, common, files)
        check_checkpoints(dmc, tmp, np, stio, common, files, "2bw",
                          lambda kind, mesh, micros, drains: reference(torch, init, xs, ys, kind, STEPS, norm,
                                                                       drains=drains)[1])
    return ("the 2bw schedule follows W(t+1) = W(t) - opt(grad at W(t-1)) (PyTorch) on %d meshes, %d steps"
            % (len(CASES) + len(EMBED_CASES) + len(TIED_CASES), STEPS))


# fp16's loss scaler under 2bw: an update skipped (its gradients not finite on some stage)
# leaves the weights as they were, so a run whose first k updates are skipped trains as a
# run without those k batches, from the same weights at the scale halved k times: W(t + 1)
# = W(t) - opt(grad of batch t at W(t - 1)) with the first k terms gone takes batch t + k's
# gradient at the shorter run's W(t - 1). The stages agree on each skip (their update's
# check is summed over the mesh) and unscale by the scale the last stage seeded that batch
# with.
FP16_MESHES = ["pipeline=2", "pipeline=3", "data=2,pipeline=2"]
FP16_SCALE = 2 ** 20  # the first gradients of the test's mlp.dm overflow fp16 at it


def check_fp16(dmc, tmp, np, stio, src_path, init_path, xs, ys):
    """Each FP16_MESHES run skipping its first updates against the run without their batches."""
    whole, shifted = os.path.join(tmp, "fp16-whole.safetensors"), os.path.join(tmp, "fp16-shifted.safetensors")
    stio.save({"x": xs, "y": ys}, whole)
    for mesh in FP16_MESHES:
        common = ["--set", "B=%d,H=%d" % (test_mlp.B, test_mlp.H), "--init", init_path, "--mesh", mesh,
                  "--microbatches", "4", "--schedule", "2bw", "--precision", "fp16", "--loss-scale-interval", "1000"]
        out_a, out_b = os.path.join(tmp, "fp16-a.safetensors"), os.path.join(tmp, "fp16-b.safetensors")
        a = dmcrun.run_dmc_steps(dmc, src_path, tmp, common + ["--loss-scale", str(FP16_SCALE), "--batch-file", whole,
                                                               "--steps", str(STEPS), "--save", out_a], timeout=240)
        skipped_a = [i + 1 for i, s in enumerate(a) if s.get("skipped")]
        k = len(skipped_a)
        if not 0 < k < STEPS - 2 or skipped_a != list(range(2, k + 2)):
            raise Failure("fp16 2bw %s: skipped steps %s; expected the first updates (steps 2, 3, ...) and not all"
                          % (mesh, skipped_a))
        stio.save({"x": xs[k:], "y": ys[k:]}, shifted)
        b = dmcrun.run_dmc_steps(dmc, src_path, tmp, common + ["--loss-scale", str(FP16_SCALE >> k), "--batch-file",
                                                               shifted, "--steps", str(STEPS - k), "--save", out_b],
                                 timeout=240)
        if any(s.get("skipped") for s in b):
            raise Failure("fp16 2bw %s: the run without the first %d batches skipped steps too" % (mesh, k))
        if [s["loss"] for s in a[k:]] != [s["loss"] for s in b]:
            raise Failure("fp16 2bw %s: losses after the skips %s, without those batches %s"
                          % (mesh, [s["loss"] for s in a[k:]], [s["loss"] for s in b]))
        wa, wb = stio.load(out_a), stio.load(out_b)
        for name in wa:
            if not np.array_equal(wa[name], wb[name]):
                raise Failure("fp16 2bw %s: %s after the skipped update differs from the run without batch 1"
                              % (mesh, name))
        print("fp16 2bw %-18s the first %d updates skipped (scale %d -> %d): as the run without those batches, bit "
              "for bit" % (mesh, k, FP16_SCALE, FP16_SCALE >> k))


def schedule_args(common, label, mesh, micros, schedule, out):
    """`dmc run`'s arguments for a case of CASES' form: STEPS steps on `mesh` with `micros`
    micro-batches under `schedule`, the weights saved to `out`; a label ending in -mpi runs
    on the MPI backend."""
    args = common + ["--mesh", mesh, "--microbatches", str(micros), "--schedule", schedule, "--steps", str(STEPS),
                     "--save", out]
    return args + (["--backend", "mpi"] if label.endswith("-mpi") else [])


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
