#!/usr/bin/python3
"""test_mlp.py: PyTorch oracle for examples/mlp.dm (meson test `ref-mlp-pytorch`).

usage: /usr/bin/python3 tests/ref/test_mlp.py DMC SOURCE_ROOT

The model is compiled with small dims (--set B=16,H=64; D=784 and K=10 stay) and run
with `dmc run` from initial weights and batches generated here (fixed seeds, written
with stio.py and passed via --init / --batch-file). An equivalent float32 torch module
(weights stored [in, out], y = x @ W + b, the input standardisation `xn = (x - MEAN) /
STD` if the file has one, mean cross-entropy) is the reference; model_signature checks
the file still has the structure mirrored here:

  a) step 1: loss, and every gradient from --dump-grads vs torch autograd;
  b) 10 steps of SGD (lr 0.05, momentum 0.9, weight_decay 1e-3) on a copy of the file
     with the optimizer line replaced: the 10 printed losses and the --save'd weights
     vs torch.optim.SGD;
  c) 10 steps of the file as is (adamw lr 1e-3, weight_decay 1e-4): same vs
     torch.optim.AdamW;
  plus the other optimizer paths the same way: SGD with nesterov, SGD with dampening,
  plain SGD, and an AdamW with non-default betas/eps and a large weight decay (in (c)
  the decay is too small to see; see optimizer_cases), and AdamW and SGD with
  weight_decay_1d = false against torch's two groups (nanoGPT's: no decay on the biases).

Bounds (all checked element-wise; each measured maximum is printed):
  losses:   |dmc - torch| <= 1e-5 * |torch|
  grads:    |dmc - torch| <= 1e-5 + 1e-4 * |torch|
  weights:  |dmc - torch| <= 1e-5 after 10 steps
Justification: both sides compute in float32 but sum in different orders (OpenBLAS
blocking vs torch's kernels), so each value may differ by a few float32 ulps (2^-24 ~
6e-8 relative) times a condition factor from cancellation in the sums (reductions of
up to 784 terms). The gradients here are O(1e-3..1e-1), so 1e-4 relative is ~1700 ulps
of headroom for that, and the 1e-5 absolute term covers elements that cancel to near
zero (where a relative bound is meaningless). The test also prints how far torch
float32 itself is from torch float64, the scale of legitimate float32 noise: the dmc
errors should be of that order or below, far below the bounds; a real bug (a wrong
transpose, a missing bias or weight-decay term, a wrong beta or bias correction) is off
by >= 1e-3. The reference is torch float32, not float64, on purpose: AdamW's first
steps are ~lr*sign(g), so elements with near-zero gradients are rounding-sensitive
(before the example standardised its pixels, fc1.weight after (c) differed by 1.4e-5
between torch float32 and float64, while dmc and torch float32 agreed within 1.1e-6).
Measured with B=16, H=64 and these seeds: loss errors <= 1.2e-7 relative, gradient
errors <= 6e-8 absolute, weight errors <= 4e-7 absolute.

Exit status: 0 pass, 1 failure (message on stderr), 77 torch/numpy unavailable (skip),
2 usage.
"""
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
from dmcrun import Failure  # noqa: E402

B, H, D, K = 16, 64, 784, 10
STEPS = 10
LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
WEIGHT_ATOL = 1e-5
ADAMW_LINE = "optimizer adamw(lr = 1e-3, weight_decay = 1e-4)"
OPTIMIZER_RE = re.compile(r"^optimizer .*$", re.M)
PARAMS = [("fc1.weight", (D, H)), ("fc1.bias", (H,)),
          ("fc2.weight", (H, H)), ("fc2.bias", (H,)),
          ("fc3.weight", (H, K)), ("fc3.bias", (K,))]


_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
# optional input standardisation, `xn = (x - MEAN) / STD`, feeding fc1
NORM_RE = re.compile(r"^xn\s*=\s*\(\s*x\s*-\s*%s\s*\)\s*/\s*%s\s*(?:#.*)?$" % (_NUM, _NUM), re.M)



def model_signature(src):
    """Checks that the example is the model mirrored in torch_run; returns (mean, std)
    of its input standardisation, or None when fc1 takes x directly."""
    norm = NORM_RE.search(src)
    body = [ln.split("#")[0].strip() for ln in src.splitlines()]
    need = ["h1 = relu(fc1(%s))" % ("xn" if norm else "x"), "h2 = relu(fc2(h1))",
            "logits = fc3(h2)", "loss = cross_entropy(logits, y)", "minimize loss",
            "layer fc1 = column_linear[D, H]", "layer fc2 = row_linear[H, H]", "layer fc3 = linear[H, K]",
            "return x @ weight + bias", "input x : f32[B@data, D]", "input y : i32[B@data]"]
    missing = [n for n in need if n not in body]
    if missing:
        raise Failure("examples/mlp.dm no longer has %s; update the torch mirror in test_mlp.py"
                      % ", ".join("'%s'" % m for m in missing))
    return (float(norm.group(1)), float(norm.group(2))) if norm else None


def make_data(np, torch):
    """Initial weights (xavier-uniform weights, small random biases) and STEPS batches."""
    g = torch.Generator().manual_seed(1234)
    init = {}
    for name, shape in PARAMS:
        if len(shape) == 2:
            bound = (6.0 / (shape[0] + shape[1])) ** 0.5
            t = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound
        else:
            t = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * 0.1
        init[name] = t.numpy().astype(np.float32)
    rng = np.random.default_rng(5678)
    xs = rng.random((STEPS, B, D), dtype=np.float64).astype(np.float32)
    ys = rng.integers(0, K, size=(STEPS, B)).astype(np.int32)
    return init, xs, ys


def write_data(np, torch, tmp):
    """make_data's weights and batches as files in tmp: (init, xs, ys, the `dmc run`
    arguments that read them)."""
    import stio
    init, xs, ys = make_data(np, torch)
    init_path = os.path.join(tmp, "init.safetensors")
    batch_path = os.path.join(tmp, "batches.safetensors")
    stio.save(init, init_path)
    stio.save({"x": xs, "y": ys}, batch_path)
    return init, xs, ys, ["--init", init_path, "--batch-file", batch_path]


def torch_run(torch, init, xs, ys, make_opt, steps, dtype, norm, make_sched=None, clip=None, trace=None):
    """Trains the torch equivalent; returns (losses, grads after step 1, final params).
    make_sched: optimizer -> learning-rate scheduler, stepped after each update; clip:
    clip_grad_norm_'s max_norm; trace: a list that gets each step's (learning rate,
    gradient norm before clipping)."""
    import torch.nn.functional as F
    p = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in init.items()}
    opt = make_opt([p[n] for n, _ in PARAMS]) if make_opt else None
    sched = make_sched(opt) if make_sched else None
    losses, grads1 = [], None
    for s in range(steps):
        x = torch.tensor(xs[s % len(xs)], dtype=dtype)
        y = torch.tensor(ys[s % len(ys)], dtype=torch.int64)
        for t in p.values():
            t.grad = None
        if norm:
            # dmc computes the constants in float32: round them the same way
            x = (x - torch.tensor(norm[0], dtype=torch.float32).to(dtype)) \
                / torch.tensor(norm[1], dtype=torch.float32).to(dtype)
        h1 = torch.relu(x @ p["fc1.weight"] + p["fc1.bias"])
        h2 = torch.relu(h1 @ p["fc2.weight"] + p["fc2.bias"])
        logits = h2 @ p["fc3.weight"] + p["fc3.bias"]
        loss = F.cross_entropy(logits, y)
        loss.backward()
        losses.append(loss.item())
        if grads1 is None:
            grads1 = {n: t.grad.detach().double().numpy().copy() for n, t in p.items()}
        grad_norm = torch.nn.utils.clip_grad_norm_(list(p.values()), clip).item() if clip else None
        if trace is not None:
            trace.append((opt.param_groups[0]["lr"], grad_norm))
        if opt:
            opt.step()
        if sched:
            sched.step()
    return losses, grads1, {n: t.detach().double().numpy() for n, t in p.items()}


def optimizer_cases(torch):
    """(label, optimizer line or None for the file as is, torch optimizer factory)."""
    SGD, AdamW = torch.optim.SGD, torch.optim.AdamW
    return [
        # b) the brief's SGD: momentum and weight decay
        ("sgd", "optimizer sgd(lr = 0.05, momentum = 0.9, weight_decay = 1e-3)",
         lambda ps: SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3)),
        # the other SGD paths: nesterov, dampening, plain
        ("sgd-nesterov", "optimizer sgd(lr = 0.02, momentum = 0.9, weight_decay = 1e-3, nesterov = true)",
         lambda ps: SGD(ps, lr=0.02, momentum=0.9, weight_decay=1e-3, nesterov=True)),
        # (a step size at which the loss falls: where it rises, trajectories are chaotic and
        # amplify the compilers' rounding differences, gcc against clang, past any bound)
        ("sgd-damp", "optimizer sgd(lr = 0.02, momentum = 0.5, dampening = 0.5, weight_decay = 1e-2)",
         lambda ps: SGD(ps, lr=0.02, momentum=0.5, dampening=0.5, weight_decay=1e-2)),
        ("sgd-plain", "optimizer sgd(lr = 0.1)", lambda ps: SGD(ps, lr=0.1)),
        # c) the file as is: adamw(lr = 1e-3, weight_decay = 1e-4)
        ("adamw", None,
         lambda ps: AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)),
        # In (c) the decoupled decay moves weights by only ~lr*wd*|w|*10 ~ 3e-7, below
        # the bound, so a missing decay would pass. This AdamW has every hyper-parameter
        # away from its default and a large decay: dropping the decay, L2 instead of
        # decoupled decay, or a wrong beta1/beta2/eps each changes the losses by >= 4e-3
        # relative (checked by mutating the line), while float32 noise (torch f32 vs
        # f64) stays < 2e-6.
        # (A larger lr with a small eps is ill-conditioned: near-zero gradients make
        # m/sqrt(v) rounding-sensitive, torch f32 vs f64 differs by > 1e-5 there.)
        ("adamw-hp", "optimizer adamw(lr = 2e-3, beta1 = 0.8, beta2 = 0.99, eps = 1e-5, weight_decay = 1.0)",
         lambda ps: AdamW(ps, lr=2e-3, betas=(0.8, 0.99), eps=1e-5, weight_decay=1.0)),
        # weight_decay_1d = false: nanoGPT's two groups, the biases (1-D) without decay. Against
        # the same optimizer with one group the biases part by far more than the bound
        # (DECAY_1D_APART checks it: else a program ignoring the setting would pass)
        ("adamw-decay-2d",
         "optimizer adamw(lr = 2e-3, beta1 = 0.8, beta2 = 0.99, eps = 1e-5, weight_decay = 1.0, weight_decay_1d = false)",
         lambda ps: AdamW(decay_groups(ps), lr=2e-3, betas=(0.8, 0.99), eps=1e-5, weight_decay=1.0)),
        ("sgd-decay-2d", "optimizer sgd(lr = 0.05, momentum = 0.9, weight_decay = 0.5, weight_decay_1d = false)",
         lambda ps: SGD(decay_groups(ps), lr=0.05, momentum=0.9, weight_decay=0.5)),
    ]


def decay_groups(params):
    """nanoGPT's parameter groups: weight decay on the matrices, none on the 1-D tensors."""
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


# the least the biases of a decay-2d case must differ from one group's (10 x WEIGHT_ATOL)
DECAY_1D_APART = 1e-4


def run_dmc(dmc, dm_file, tmp, args):
    return dmcrun.run_dmc(dmc, dm_file, tmp, ["--set", "B=%d,H=%d" % (B, H)] + args, timeout=240)


def check_losses(what, got, want):
    dmcrun.check_losses(what, got, want, LOSS_RTOL)


def check_tensors(np, what, got, want, atol, rtol, ref64=None):
    """Element-wise |got - want| <= atol + rtol * |want| for every parameter name."""
    failures = []
    for name, shape in PARAMS:
        if name not in got:
            failures.append("%s: tensor '%s' missing from dmc's file" % (what, name))
            continue
        g = got[name].astype(np.float64)
        w = want[name]
        if g.shape != tuple(shape):
            failures.append("%s: '%s' has shape %s, expected %s" % (what, name, list(g.shape), list(shape)))
            continue
        err = np.abs(g - w)
        ratio = err / (atol + rtol * np.abs(w))
        k = dmcrun.worst_at(ratio)
        noise = ""
        if ref64 is not None:
            noise = "; torch f32 vs f64 %.3g" % float(np.max(np.abs(w - ref64[name])))
        print("%-12s %-10s max abs error %.3g (max |torch| %.3g, worst error/bound %.3g)%s"
              % (what, name, float(err.max()), float(np.abs(w).max()), float(ratio.flat[k]), noise))
        if not ratio.flat[k] <= 1.0:
            idx = np.unravel_index(k, g.shape)
            failures.append("%s: %s%s: dmc %.9g vs torch %.9g, error %.3g > bound %.3g (%.0e + %.0e * |torch|)"
                            % (what, name, list(idx), g[idx], w[idx], err[idx],
                               atol + rtol * abs(w[idx]), atol, rtol))
    if failures:
        raise Failure("\n".join(failures))


def with_optimizer(src, line, directory):
    """src with its optimizer line replaced by `line`, written as mlp.dm in `directory` (made
    here; the file name, hence the model's and its parameters' names, stay examples/mlp.dm's).
    Returns its path."""
    os.mkdir(directory)
    path = os.path.join(directory, "mlp.dm")
    with open(path, "w") as f:
        f.write(OPTIMIZER_RE.sub(line, src))
    return path


def example(root, test):
    """examples/mlp.dm as the reference tests mirror it: (its path, its text, its input
    standardisation: model_signature's); a Failure naming `test` when it has changed."""
    path = os.path.join(root, "examples", "mlp.dm")
    with open(path) as f:
        src = f.read()
    if len(OPTIMIZER_RE.findall(src)) != 1 or ADAMW_LINE not in src:
        raise Failure("%s: expected exactly one optimizer line, '%s'; update %s" % (path, ADAMW_LINE, test))
    return path, src, model_signature(src)


def run_checks(dmc, root, np, torch):
    import stio
    torch.manual_seed(0)
    src_path, src, norm = example(root, "test_mlp.py")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-mlp-") as tmp:
        init, xs, ys, common = write_data(np, torch, tmp)
        # a) forward loss and gradients of step 1
        grads_path = os.path.join(tmp, "grads.safetensors")
        d_losses = run_dmc(dmc, src_path, tmp, common + ["--steps", "1", "--dump-grads", grads_path])
        t_losses, t_grads, _ = torch_run(torch, init, xs, ys, None, 1, torch.float32, norm)
        _, t_grads64, _ = torch_run(torch, init, xs, ys, None, 1, torch.float64, norm)
        check_losses("step1", d_losses, t_losses)
        check_tensors(np, "grad", stio.load(grads_path), t_grads, GRAD_ATOL, GRAD_RTOL, t_grads64)

        # b), c) and more: STEPS steps of each optimizer
        for label, line, make_opt in optimizer_cases(torch):
            dm_file = src_path if line is None else with_optimizer(src, line, os.path.join(tmp, label))
            out = os.path.join(tmp, label + ".safetensors")
            d_losses = run_dmc(dmc, dm_file, tmp, common + ["--steps", str(STEPS), "--save", out])
            t_losses, _, t_final = torch_run(torch, init, xs, ys, make_opt, STEPS, torch.float32, norm)
            _, _, t_final64 = torch_run(torch, init, xs, ys, make_opt, STEPS, torch.float64, norm)
            check_losses(label, d_losses, t_losses)
            check_tensors(np, label, stio.load(out), t_final, WEIGHT_ATOL, 0.0, t_final64)
            if label.endswith("decay-2d"):
                check_decay_matters(torch, np, init, xs, ys, norm, label, make_opt, t_final)
    return ("examples/mlp.dm matches PyTorch (B=%d, H=%d): step-1 loss and gradients, %d steps of SGD and of AdamW"
            % (B, H, STEPS))


def check_decay_matters(torch, np, init, xs, ys, norm, label, make_opt, t_final):
    """The case's biases against the same optimizer in one group (every parameter decayed):
    they must part by DECAY_1D_APART, or the case cannot tell the setting from its absence."""
    torch_opt = make_opt([torch.zeros(2, 2, requires_grad=True), torch.zeros(2, requires_grad=True)])
    decay = torch_opt.param_groups[0]["weight_decay"]
    kind = type(torch_opt)
    extra = {k: v for k, v in torch_opt.defaults.items() if k in ("lr", "betas", "eps", "momentum")}
    one_group = lambda ps: kind(ps, weight_decay=decay, **extra)  # noqa: E731
    _, _, single = torch_run(torch, init, xs, ys, one_group, STEPS, torch.float32, norm)
    apart = max(float(np.max(np.abs(single[n] - t_final[n]))) for n in single if single[n].ndim < 2)
    print("%-16s biases apart from one group's by %.3g (at least %g)" % (label, apart, DECAY_1D_APART))
    if apart < DECAY_1D_APART:
        raise Failure("%s: the biases part from one group's by only %.3g: the case no longer tests weight_decay_1d"
                      % (label, apart))


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
