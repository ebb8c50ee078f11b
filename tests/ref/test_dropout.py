"""test_dropout.py DMC SRCROOT: dropout(x, p)'s mask, its statistics and its gradient.

A model whose loss is sum(dropout(w1, p) * x) + sum(dropout(w2, p) * x) with w1, w2 all
ones (f32[B, D], 2^18 elements each) has gradients mask_k * x / (1 - p): with x = ones,
--dump-grads gives each dropout's mask scaled. For p = 0.1 and 0.5:
  - the fraction dropped is p within 5 binomial sigmas, survivors are exactly 1 / (1 - p);
  - the two dropouts (one step), two seeds, and two steps (SGD with lr = 0 keeps w at ones,
    so each step's loss is the kept count scaled: they differ) draw different masks;
  - with x random, the gradients equal torch's backward of x * mask / (1 - p) given the mask
    read from the x = ones run (same seed, same step: the key does not depend on x).
And tests/spmd/dropout.dm (dropout in four residual blocks) trains to the same losses and
weights, bit for bit, with --recompute full as without: the recomputed copies redraw
their masks from the same keys.
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stio  # noqa: E402
from dmcrun import Failure, import_reference, run_dmc  # noqa: E402

B, D = 256, 1024
MODEL = """dim B = %d
dim D = %d
input x : f32[B, D]
param w1 : f32[B, D] = ones
param w2 : f32[B, D] = ones
loss = sum(dropout(w1, %s) * x) + sum(dropout(w2, %s) * x)
minimize loss
optimizer sgd(lr = 0)
"""


def grads(dmc, dm, tmp, x, seed, steps, tag):
    bf = os.path.join(tmp, "b-%s.safetensors" % tag)
    stio.save({"x": np.repeat(x[None], steps, 0)}, bf)
    g = os.path.join(tmp, "g-%s.safetensors" % tag)
    losses = run_dmc(dmc, dm, tmp, ["--batch-file", bf, "--steps", str(steps), "--seed", str(seed),
                                    "--dump-grads", g], timeout=300)
    return stio.load(g), losses


def check_p(dmc, tmp, p, torch):
    dm = os.path.join(tmp, "drop%d.dm" % int(p * 100))
    with open(dm, "w") as f:
        f.write(MODEL % (B, D, p, p))
    ones = np.ones((B, D), np.float32)
    g, losses = grads(dmc, dm, tmp, ones, 1, 3, "ones%g" % p)
    scale = np.float32(1.0 / (1.0 - p))
    n = B * D
    for name in ("w1", "w2"):
        m = g[name]
        dropped = float(np.mean(m == 0))
        sigma = np.sqrt(p * (1 - p) / n)
        print("p=%g %s: dropped %.5f (p +- 5 sigma = %.5f), survivors %s" % (p, name, dropped, 5 * sigma,
                                                                             np.unique(m[m != 0])))
        if abs(dropped - p) > 5 * sigma:
            raise Failure("p=%g: %s dropped %.5f, outside p +- 5 sigma" % (p, name, dropped))
        if not np.all(m[m != 0] == scale):
            raise Failure("p=%g: survivors are not scaled by 1/(1-p) = %r" % (p, scale))
    if np.array_equal(g["w1"], g["w2"]):
        raise Failure("p=%g: two dropouts of one step drew the same mask" % p)
    if len(set(losses)) != len(losses):
        raise Failure("p=%g: steps drew the same masks: losses %s" % (p, losses))
    other, _ = grads(dmc, dm, tmp, ones, 2, 1, "seed2-%g" % p)
    if np.array_equal(other["w1"], g["w1"]):
        raise Failure("p=%g: seeds 1 and 2 drew the same mask" % p)
    # the gradient against torch, given the mask (step 1, seed 1)
    x = np.random.default_rng(5).standard_normal((B, D)).astype(np.float32)
    got, _ = grads(dmc, dm, tmp, x, 1, 1, "x%g" % p)
    for name in ("w1", "w2"):
        mask = torch.from_numpy((g[name] != 0).astype(np.float32))
        w = torch.ones((B, D), requires_grad=True)
        (w * mask * (1.0 / (1.0 - p)) * torch.from_numpy(x)).sum().backward()
        err = float(np.max(np.abs(got[name] - w.grad.numpy())))
        print("p=%g %s: gradient vs torch given the mask: max abs error %.2e" % (p, name, err))
        if err > 1e-6:
            raise Failure("p=%g: the gradient of %s differs from torch's by %.3g" % (p, name, err))


def check_recompute(dmc, root, tmp):
    dm = os.path.join(root, "tests/spmd/dropout.dm")
    rng = np.random.default_rng(3)
    bf = os.path.join(tmp, "stack.safetensors")
    stio.save({"x": rng.standard_normal((4, 16, 32)).astype(np.float32),
               "y": rng.integers(0, 8, (4, 16)).astype(np.int32)}, bf)
    out = {}
    for mode in ("off", "full"):
        saved = os.path.join(tmp, "w-%s.safetensors" % mode)
        losses = run_dmc(dmc, dm, tmp, ["--batch-file", bf, "--steps", "4", "--seed", "7", "--recompute", mode,
                                        "--save", saved], timeout=300)
        out[mode] = (losses, stio.load(saved))
    print("recompute off: losses %s; full: %s" % (out["off"][0], out["full"][0]))
    if out["off"][0] != out["full"][0]:
        raise Failure("--recompute full changed the losses")
    for name, w in out["off"][1].items():
        if not np.array_equal(w, out["full"][1][name]):
            raise Failure("--recompute full changed %s" % name)


def main():
    dmc, root = sys.argv[1:3]
    ref = import_reference()
    if ref is None:
        return 77
    _, torch = ref
    with tempfile.TemporaryDirectory(prefix="dmc-dropout-") as tmp:
        try:
            for p in (0.1, 0.5):
                check_p(dmc, tmp, p, torch)
            check_recompute(dmc, os.path.abspath(root), tmp)
        except Failure as e:
            print("FAIL %s" % e)
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
