#!/usr/bin/env python3
"""test_compact.py DMC: dmc --compact (docs/compression.md, "Compacting a row-pruned model").

examples/mlp.dm with B 32, H 64, trained 8 steps with --prune 0.5:rows on a Fashion-MNIST-
shaped data set (test_checkpoint.py's), its weights saved: half of fc1's and fc2's output
channels are exactly 0, their biases not (AdamW moved them), so relu(bias) of a removed
channel is a constant that must go into the next layer's bias. Oracles: PyTorch forwards of
the pruned and of the compacted weights, numpy's gather and fold, the uncompacted program.

  a) the compacted program's --predict logits equal the pruned program's (1e-5) and a PyTorch
     forward of the compacted weights; the pruned program's equal a PyTorch forward of the
     pruned weights (so both sides are checked independently);
  b) --save-compacted's tensors: fc1 [784, k1], fc2 [k1, k2], fc3 [k2, 10] with k1, k2 the
     nonzero columns of the pruned fc1, fc2 (fc3 feeds the logits: kept whole); the values
     are numpy's gather of the kept channels, fc2's and fc3's biases plus the removed
     channels' relu(bias) @ their next weight's rows;
  c) --evaluate of the compacted program, serial and --mesh data=2, prints the pruned program's
     test accuracy;
  d) --explain names what shrank and why fc3 did not;
  e) gpt.dm made small, random weights, half of each c_fc's columns zeroed: the MLPs (rank-3
     activations, gelu) shrink and nothing else, and the logits equal the pruned program's;
  f) errors, each a message naming the file and nothing written: weights pruned without
     :rows (no zero column), a file of another model size (naming the tensor), a file
     that is no safetensors, --save-compacted without --compact, --compact with --mesh auto,
     --init with dmc run --compact, --save-compacted naming the --compact file, a NaN in the pruned file (naming it and the tensor), and
     finite weights whose fold overflows (the compacted file not written).
Prints one line per check; exits 1 on any failure.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_checkpoint  # noqa: E402
from test_checkpoint import check, fashion_like, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "examples", "mlp.dm")
SETS = ["--set", "B=32,H=64"]


def tensors(path):
    got, _ = read_safetensors(path)
    return {k: np.frombuffer(blob, dtype=np.float32).reshape(shape) for k, (dtype, shape, blob) in got.items()}


def dmc(exe, args, tmp, expect=0):
    r = subprocess.run([exe] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    if r.returncode != expect:
        print("FAIL: dmc %s: exit %d, expected %d\n%s" % (" ".join(args), r.returncode, expect, r.stderr))
        sys.exit(1)
    return r


def forward(w, x):
    def lin(h, name):
        return h @ torch.from_numpy(w[name + ".weight"].copy()) + torch.from_numpy(w[name + ".bias"].copy())
    h = (torch.from_numpy(x) - 0.2860) / 0.3530
    h = torch.relu(lin(h, "fc1"))
    h = torch.relu(lin(h, "fc2"))
    return lin(h, "fc3").numpy()


def expected_compaction(p):
    """numpy's compaction of the pruned weights p: kept columns, folded biases."""
    w = {k: v.astype(np.float64) for k, v in p.items()}
    for layer, nxt in (("fc1", "fc2"), ("fc2", "fc3")):
        keep = np.any(w[layer + ".weight"] != 0, axis=0)
        const = np.maximum(w[layer + ".bias"][~keep], 0.0)
        w[nxt + ".bias"] = w[nxt + ".bias"] + const @ w[nxt + ".weight"][~keep, :]
        w[layer + ".weight"] = w[layer + ".weight"][:, keep]
        w[layer + ".bias"] = w[layer + ".bias"][keep]
        w[nxt + ".weight"] = w[nxt + ".weight"][keep, :]
    return w


def accuracy(stdout):
    m = re.findall(r"test accuracy ([0-9.]+)", stdout)
    return m[-1] if m else None


def check_numbers(exe, tmp, data):
    dmc(exe, ["run", MODEL] + SETS + ["--prune", "0.5:rows", "--", "--steps", "8", "--data-dir", data,
                                     "--save", "pruned.st", "--quiet"], tmp)
    p = tensors(os.path.join(tmp, "pruned.st"))
    zero = {l: int(np.sum(~np.any(p[l + ".weight"] != 0, axis=0))) for l in ("fc1", "fc2")}
    folds = int(np.sum(p["fc1.bias"][~np.any(p["fc1.weight"] != 0, axis=0)] > 0))
    check(zero == {"fc1": 32, "fc2": 32} and folds > 0,
          "the pruned run: 32 of 64 channels of fc1, fc2 zero, %d removed channels with relu(bias) > 0" % folds)
    x = np.random.default_rng(1).random((45, 784), dtype=np.float32)
    write_safetensors(os.path.join(tmp, "x.st"), {"x": ("F32", [45, 784], x.tobytes())}, {})
    dmc(exe, ["run", MODEL] + SETS + ["--", "--init", "pruned.st", "--predict", "--batch-file", "x.st",
                                     "--out", "full.st", "--quiet"], tmp)
    dmc(exe, ["run", MODEL] + SETS + ["--compact", "pruned.st", "--save-compacted", "small.st", "--", "--predict",
                                     "--batch-file", "x.st", "--out", "small_out.st", "--quiet"], tmp)
    full, small = tensors(os.path.join(tmp, "full.st"))["logits"], tensors(os.path.join(tmp, "small_out.st"))["logits"]
    c = tensors(os.path.join(tmp, "small.st"))
    d_torch_full = float(np.max(np.abs(full - forward(p, x))))
    d_torch_small = float(np.max(np.abs(small - forward(c, x))))
    d_programs = float(np.max(np.abs(small - full)))
    check(max(d_torch_full, d_torch_small, d_programs) < 1e-5,
          "a) --predict: compacted vs pruned program %.1e, vs PyTorch on the compacted weights %.1e (pruned %.1e)"
          % (d_programs, d_torch_small, d_torch_full))
    want = expected_compaction(p)
    shapes = {k: list(v.shape) for k, v in c.items()}
    check(shapes == {"fc1.weight": [784, 32], "fc1.bias": [32], "fc2.weight": [32, 32], "fc2.bias": [32],
                     "fc3.weight": [32, 10], "fc3.bias": [10]}, "b) compacted shapes %s" % shapes)
    d_values = max(float(np.max(np.abs(c[k] - want[k]))) for k in want)
    check(d_values < 1e-6, "b) compacted values: numpy's gather and fold within %.1e" % d_values)
    a_full = accuracy(dmc(exe, ["run", MODEL] + SETS + ["--", "--init", "pruned.st", "--evaluate", "--data-dir",
                                                       data], tmp).stdout)
    a_small = accuracy(dmc(exe, ["run", MODEL] + SETS + ["--compact", "pruned.st", "--", "--evaluate",
                                                        "--data-dir", data], tmp).stdout)
    a_data = accuracy(dmc(exe, ["run", MODEL] + SETS + ["--mesh", "data=2", "--compact", "pruned.st", "--",
                                                       "--evaluate", "--data-dir", data], tmp).stdout)
    check(a_full is not None and a_full == a_small == a_data,
          "c) --evaluate: test accuracy %s compacted (%s on --mesh data=2), %s pruned" % (a_small, a_data, a_full))
    text = dmc(exe, ["--explain", MODEL] + SETS + ["--compact", "pruned.st"], tmp).stdout
    check(re.search(r"fc1\.weight +64 -> 32 output channels", text) and
          re.search(r"fc3\.weight +10 channels kept: its channels reach the model's output", text),
          "d) --explain: fc1 64 -> 32, fc3 kept (the logits)")


def check_gpt(exe, tmp):
    """gpt.dm made small: each block's MLP (x @ c_fc + b -> gelu -> @ c_proj, rank 3) loses the
    zeroed half of c_fc's channels; the rest stays (attention's weights sliced, residual adds)."""
    sets = ["--set", "B=2,T=16,V=256,C=64,NH=2,L=2"]
    model = os.path.join(ROOT, "examples", "gpt.dm")
    ir = dmc(exe, ["--emit=ir", "--stop-after", "lower", model] + sets, tmp).stdout
    sizes = {"T": 16, "V": 256, "C": 64}
    rng = np.random.default_rng(3)
    w = {}
    for name, dims in re.findall(r"%\d+ (\S+) : param f32\[([^\]]*)\]", ir):
        shape = [int(sizes.get(d.split("@")[0], d.split("@")[0])) for d in dims.split(", ")]
        v = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if "c_attn" in name:  # stored as [C, 3 * C] and [3 * C]
            v = v.reshape(64, 192) if name.endswith("weight") else v.reshape(192)
        w[name] = v
    for layer in range(2):
        w["h.%d.mlp.c_fc.weight" % layer][:, rng.choice(256, 128, replace=False)] = 0
    write_safetensors(os.path.join(tmp, "gpt.st"), {k: ("F32", list(v.shape), v.tobytes()) for k, v in w.items()}, {})
    tokens = rng.integers(0, 256, (5, 16)).astype(np.int32)
    write_safetensors(os.path.join(tmp, "tokens.st"), {"tokens": ("I32", [5, 16], tokens.tobytes())}, {})
    predict = ["--predict", "--batch-file", "tokens.st", "--quiet", "--out"]
    dmc(exe, ["run", model] + sets + ["--", "--init", "gpt.st"] + predict + ["gpt_full.st"], tmp)
    dmc(exe, ["run", model] + sets + ["--compact", "gpt.st", "--save-compacted", "gpt_small.st", "--"] + predict
        + ["gpt_small_out.st"], tmp)
    full = tensors(os.path.join(tmp, "gpt_full.st"))["logits"]
    small = tensors(os.path.join(tmp, "gpt_small_out.st"))["logits"]
    c = tensors(os.path.join(tmp, "gpt_small.st"))
    shrunk = sorted(k for k in c if c[k].shape != w[k].shape)
    want = ["h.%d.mlp.c_%s" % (l, n) for l in range(2) for n in ("fc.bias", "fc.weight", "proj.weight")]
    d = float(np.max(np.abs(full - small)))
    check(shrunk == want and c["h.0.mlp.c_fc.weight"].shape == (64, 128) and d < 1e-5,
          "e) gpt.dm (B=2,T=16,V=256,C=64,NH=2,L=2): only the MLPs shrink (%s), logits within %.1e of the pruned "
          "program's" % (", ".join(shrunk), d))


def refused(exe, tmp, args, want, what):
    before = set(os.listdir(tmp))
    r = subprocess.run([exe] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300)
    after = set(os.listdir(tmp))
    check(r.returncode != 0 and want in r.stderr and after == before,
          "f) %s: refused, nothing written (%s)" % (what, r.stderr.strip().splitlines()[0] if r.stderr else ""))


def check_errors(exe, tmp):
    p = tensors(os.path.join(tmp, "pruned.st"))
    # unstructured: the same zeros' count, scattered (no whole column)
    scattered = {k: ("F32", list(v.shape), v.copy()) for k, v in p.items()}
    rng = np.random.default_rng(2)
    for name in ("fc1.weight", "fc2.weight", "fc3.weight"):
        v = rng.standard_normal(scattered[name][1]).astype(np.float32)
        v[rng.random(v.shape) < 0.5] = 0
        scattered[name] = ("F32", list(v.shape), v)
    write_safetensors(os.path.join(tmp, "scattered.st"), {k: (d, s, v.tobytes()) for k, (d, s, v) in scattered.items()}, {})
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    for f in ("scattered.st", "pruned.st"):
        shutil.copy(os.path.join(tmp, f), bad)
    with open(os.path.join(bad, "junk.st"), "wb") as f:
        f.write(b"not a safetensors file")
    out = ["--save-compacted", "c.st", "-o", "gen"]
    refused(exe, bad, [MODEL] + SETS + ["--compact", "scattered.st"] + out,
            "scattered.st: no weight has output channels to remove", "weights pruned without :rows")
    refused(exe, bad, [MODEL, "--set", "B=32,H=32", "--compact", "pruned.st"] + out,
            "--compact pruned.st: tensor 'fc1.weight' has shape [784, 64], the program's is f32[784, 32]", "a file of another model size")
    refused(exe, bad, [MODEL] + SETS + ["--compact", "junk.st"] + out, "--compact junk.st", "a file that is no safetensors")
    refused(exe, bad, [MODEL] + SETS + ["--save-compacted", "c.st", "-o", "gen"],
            "--save-compacted writes what --compact PRUNED makes", "--save-compacted without --compact")
    refused(exe, bad, [MODEL] + SETS + ["--compact", "pruned.st", "--mesh", "auto", "--devices", "2"] + out,
            "--compact cannot be combined with --mesh auto", "--compact with --mesh auto")
    refused(exe, bad, ["run", MODEL] + SETS + ["--compact", "pruned.st", "--", "--init", "pruned.st", "--predict"],
            "--init cannot be given with --compact", "dmc run --compact with --init")
    refused(exe, bad, [MODEL] + SETS + ["--compact", "pruned.st", "--save-compacted", "./pruned.st", "-o", "gen"],
            "--save-compacted ./pruned.st is the --compact file", "--save-compacted over the --compact file")
    check_non_finite(exe, bad, p, out)


def check_non_finite(exe, bad, p, out):
    """f) weights that are not finite are neither read nor written: a NaN in the pruned file
    (named with the file and tensor), and finite weights whose fold overflows (a removed
    channel's relu(bias) 3e38 times its next weight's row of 4s, added to fc2's bias)."""
    nan = {k: ("F32", list(v.shape), v.copy()) for k, v in p.items()}
    nan["fc2.bias"][2][3] = np.nan
    write_safetensors(os.path.join(bad, "nan.st"), {k: (d, s, v.tobytes()) for k, (d, s, v) in nan.items()}, {})
    refused(exe, bad, [MODEL] + SETS + ["--compact", "nan.st"] + out,
            "--compact nan.st: tensor 'fc2.bias' holds a non-finite value: nan at element 3", "a NaN in the pruned file")
    fold = {k: ("F32", list(v.shape), v.copy()) for k, v in p.items()}
    j = int(np.flatnonzero(~np.any(p["fc1.weight"] != 0, axis=0))[0])
    fold["fc1.bias"][2][j] = np.float32(3e38)
    fold["fc2.weight"][2][j, :] = 4.0
    write_safetensors(os.path.join(bad, "fold.st"), {k: (d, s, v.tobytes()) for k, (d, s, v) in fold.items()}, {})
    r = subprocess.run([exe, MODEL] + SETS + ["--compact", "fold.st"] + out, cwd=bad, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    want = "--compact: c.st not written: tensor 'fc2.bias' holds a non-finite value after compaction (inf at element"
    check(r.returncode != 0 and want in r.stderr and not os.path.exists(os.path.join(bad, "c.st")),
          "f) a fold that overflows: refused, c.st not written (%s)" % (r.stderr.strip().splitlines() or [""])[0])


def main():
    if len(sys.argv) != 2:
        print("usage: test_compact.py DMC")
        return 2
    exe = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-compact-")
    try:
        data = fashion_like(tmp)
        check_numbers(exe, tmp, data)
        check_gpt(exe, tmp)
        check_errors(exe, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if test_checkpoint.failures else 0


if __name__ == "__main__":
    sys.exit(main())
