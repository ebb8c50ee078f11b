#!/usr/bin/python3
"""test_attention.py: PyTorch oracle for fused attention (meson test `ref-attention`).

usage: /usr/bin/python3 tests/ref/test_attention.py DMC SOURCE_ROOT

tests/ref/attention.dm has two attentions over the same q, k and v: a causal one written
as gpt.dm writes it, softmax(causal_mask(q @ transpose(k) / sqrt(HS)), -1) @ v, and one
over every key, softmax(q @ transpose(k) * 0.5) @ v. dmc fuses both into its attention
kernel (runtime/dmrt_attention.h: blocks of 64 queries x 64 keys, online softmax, a
backward that makes the scores again from each row's log-sum-exp). The sizes are chosen
where a tiled kernel goes wrong:

  T=67  NH=3 HS=5  B=2   two blocks, the second of 3 positions; odd head size
  T=130 NH=1 HS=8  B=1   three blocks, the last of 2; one head
  T=64  NH=2 HS=16 B=1   exactly one block
  T=1   NH=2 HS=4  B=3   one position (a query sees only itself)

For each, the test checks that the IR has the two attention ops (the fusion happened),
runs one SGD step with `dmc run --dump-grads` from weights and a batch made here, and
compares with torch float32 autograd of the same model written with its own ops
(masked_fill(-inf), softmax, matmuls):

  loss:  |dmc - torch| <= 1e-5 * |torch|
  grads: |dmc - torch| <= 1e-5 + 1e-4 * |torch|, element-wise, for wq, wk, wv (through
         dq, dk, dv) and wo (through the forward's output)

and the same for the unfused ops (--no-fuse-attention), printing how far fused and
unfused are apart. Both compute in float32 with other summation orders (the fused one
sums each row's exponentials block by block, rescaled as its maximum grows); the torch
float32 vs float64 distance is printed as the scale of that noise.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
from dmcrun import Failure  # noqa: E402

LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
PARAMS = ("wq", "wk", "wv", "wo")
CONFIGS = [
    {"B": 2, "T": 67, "NH": 3, "HS": 5},
    {"B": 1, "T": 130, "NH": 1, "HS": 8},
    {"B": 1, "T": 64, "NH": 2, "HS": 16},
    {"B": 3, "T": 1, "NH": 2, "HS": 4},
]


def torch_loss(torch, p, x, cfg):
    """attention.dm in torch ops."""
    B, T, NH, HS = cfg["B"], cfg["T"], cfg["NH"], cfg["HS"]
    C = NH * HS

    def heads(t):
        return t.reshape(B, T, NH, HS).transpose(1, 2)
    q, k, v = heads(x @ p["wq"]), heads(x @ p["wk"]), heads(x @ p["wv"])
    scores = q @ k.transpose(-1, -2)
    hidden = ~torch.ones(T, T, dtype=torch.bool).tril()
    # dmc folds sqrt(HS) to a float32 constant: divide by the same
    root = torch.tensor(HS ** 0.5, dtype=torch.float32).to(q.dtype)
    causal = torch.softmax((scores / root).masked_fill(hidden, float("-inf")), dim=-1) @ v
    every = torch.softmax(scores * 0.5, dim=-1) @ v
    y = (causal + every).transpose(1, 2).reshape(B, T, C) @ p["wo"]
    return (torch.tanh(y) * y).mean()


def torch_grads(torch, init, x, cfg, dtype):
    p = {n: torch.tensor(init[n], dtype=dtype, requires_grad=True) for n in PARAMS}
    loss = torch_loss(torch, p, torch.tensor(x, dtype=dtype), cfg)
    loss.backward()
    return loss.item(), {n: p[n].grad.double().numpy() for n in PARAMS}


def set_arg(cfg):
    return ",".join("%s=%d" % (k, v) for k, v in cfg.items())


def fused_ops(dmc, dm, cfg):
    """The attention ops in the IR after autodiff (the fusion made them)."""
    r = subprocess.run([dmc, "--emit=ir", "--stop-after=autodiff", "--set", set_arg(cfg), dm],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    if r.returncode != 0:
        raise Failure("dmc --emit=ir failed: %s" % r.stderr)
    return sum(1 for line in r.stdout.splitlines() if " = attention " in line)


def check(np, what, d_loss, d_grads, t_loss, t_grads, t64):
    """The loss and gradients against torch; returns the failures."""
    fails = []
    rel = abs(d_loss - t_loss) / abs(t_loss)
    print("%-34s loss   dmc %.9g torch %.9g, rel error %.3g (bound %.0e)" % (what, d_loss, t_loss, rel, LOSS_RTOL))
    if rel > LOSS_RTOL:
        fails.append("%s: loss %.9g vs torch %.9g (rel %.3g)" % (what, d_loss, t_loss, rel))
    for n in PARAMS:
        g, w = d_grads[n].astype(np.float64), t_grads[n]
        if g.shape != w.shape:
            fails.append("%s: grad %s has shape %s, torch %s" % (what, n, g.shape, w.shape))
            continue
        err = np.abs(g - w)
        ratio = float((err / (GRAD_ATOL + GRAD_RTOL * np.abs(w))).max())
        print("%-34s grad %s max abs error %.3g (max |torch| %.3g, error/bound %.3g; torch f32 vs f64 %.3g)"
              % (what, n, float(err.max()), float(np.abs(w).max()), ratio, float(np.abs(w - t64[n]).max())))
        if ratio > 1.0:
            fails.append("%s: grad %s: error %.3g above the bound (ratio %.3g)" % (what, n, float(err.max()), ratio))
    return fails


def run_config(np, torch, stio, dmc, dm, tmp, cfg, seed):
    B, T, C = cfg["B"], cfg["T"], cfg["NH"] * cfg["HS"]
    rng = np.random.default_rng(seed)
    init = {n: (rng.standard_normal((C, C)) * 0.5).astype(np.float32) for n in PARAMS}
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    paths = {k: os.path.join(tmp, "%d.%s.safetensors" % (seed, k)) for k in ("init", "batch", "fused", "unfused")}
    stio.save(init, paths["init"])
    stio.save({"x": x[None]}, paths["batch"])
    name = "T=%d NH=%d HS=%d B=%d" % (T, cfg["NH"], cfg["HS"], B)
    n_fused = fused_ops(dmc, dm, cfg)
    if n_fused != 2:
        return ["%s: the IR has %d attention ops, expected 2 (the fusion did not happen)" % (name, n_fused)]
    t_loss, t_grads = torch_grads(torch, init, x, cfg, torch.float32)
    _, t64 = torch_grads(torch, init, x, cfg, torch.float64)
    fails, got = [], {}
    for variant, extra in (("fused", []), ("unfused", ["--no-fuse-attention"])):
        losses = dmcrun.run_dmc(dmc, dm, tmp, ["--set", set_arg(cfg), "--init", paths["init"], "--batch-file",
                                               paths["batch"], "--steps", "1", "--dump-grads", paths[variant]] + extra,
                                timeout=120)
        got[variant] = (losses[0], stio.load(paths[variant]))
        fails += check(np, "%s %s" % (name, variant), losses[0], got[variant][1], t_loss, t_grads, t64)
    apart = max(float(np.abs(got["fused"][1][n] - got["unfused"][1][n]).max()) for n in PARAMS)
    print("%-34s fused vs unfused: losses %.9g and %.9g, gradients at most %.3g apart"
          % (name, got["fused"][0], got["unfused"][0], apart))
    return fails


def run_checks(dmc, root, np, torch):
    if dmcrun.TARGET != "c":
        print("SKIP: fused attention is the C target's")
        sys.exit(77)
    import stio
    torch.set_num_threads(1)
    dm = os.path.join(root, "tests", "ref", "attention.dm")
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-ref-attention-") as tmp:
        for seed, cfg in enumerate(CONFIGS):
            try:
                failures += run_config(np, torch, stio, dmc, dm, tmp, cfg, 2000 + seed)
            except (Failure, subprocess.TimeoutExpired) as e:
                failures.append(str(e))
    if failures:  # every size is tried
        raise Failure("\n".join(failures))
    return "fused attention matches PyTorch (loss, gradients) at %d sizes, as the unfused ops do" % len(CONFIGS)


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
