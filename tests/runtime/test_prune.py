#!/usr/bin/env python3
"""test_prune.py DMC: dmc --prune (docs/compression.md, "Pruning").

The model is examples/mlp.dm made small (B 32, H 64) on a Fashion-MNIST-shaped data set
written here (test_checkpoint.py's). Oracles: PyTorch's pruning, the schedule's formula and
the same program run straight.

  - masks: with a learning rate too small to move a weight (1e-30), the weights after update
    t are the initial ones (--init) with the mask of update t applied, so each checkpoint of
    a 4-step ramp is compared with torch.nn.utils.prune.l1_unstructured of the initial weight
    at the sparsity of Zhu and Gupta's formula for that step (per tensor: each weight matrix
    by itself), and its prune_mask tensor with 1 - torch's mask; biases are not pruned;
    --prune RATIO:rows likewise against ln_structured(n=2) over the output channels (the
    columns of a weight stored [in, out]);
  - training (AdamW, lr 1e-2) pruned to 0.5 over the first half of 8 steps: the mask of step
    4 holds to the end, its weights exactly 0 after four more updates;
  - 8 steps straight and 3 + --resume + 5 give bitwise-identical weights with the schedule's
    zero counts, serial, with --mesh data=2 (replicas choose the same masks) and with a
    2-stage pipeline (each stage prunes its own weights);
  - what is pruned (examples/gpt.dm small, 4 AdamW steps on the cookie fortunes, pruned to
    0.5 over the first two): by elements and by :rows, the head tied to the token embedding
    leaves wte.weight unpruned (as many zeros as an unpruned run's, no zero row, not in
    --explain's list), and every other weight --explain lists holds half its elements zero;
    examples/llama.dm small under :rows: no weight --compact keeps because it is "read
    transposed" is listed by --explain or has an all-zero row or column after the run;
  - errors: a ratio outside [0, 1) or not a number, --prune-start without --prune, a start
    not before the end, and combinations code generation refuses (ZeRO, tensor
    parallelism, parameter servers): each a message naming the option, nothing written.
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from torch.nn.utils import prune

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_checkpoint  # noqa: E402
from test_checkpoint import check, Trainer, fashion_like, read_safetensors, write_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WEIGHTS = ("fc1.weight", "fc2.weight", "fc3.weight")
SHAPES = {"fc1.weight": [784, 64], "fc1.bias": [64], "fc2.weight": [64, 64], "fc2.bias": [64],
          "fc3.weight": [64, 10], "fc3.bias": [10]}


def small_mlp(tmp, name, optimizer):
    with open(os.path.join(ROOT, "examples", "mlp.dm")) as f:
        src = f.read()
    src = re.sub(r"^dim B = \d+", "dim B = 32", src, flags=re.M)
    src = re.sub(r"^dim H = \d+", "dim H = 64", src, flags=re.M)
    src = re.sub(r"optimizer \w+\([^)]*\)", optimizer, src)
    d = os.path.join(tmp, name)
    os.makedirs(d)
    path = os.path.join(d, "small.dm")
    with open(path, "w") as f:
        f.write(src)
    return path


def tensors(path):
    got, _ = read_safetensors(path)
    return {k: np.frombuffer(blob, dtype=np.float32).reshape(shape) for k, (dtype, shape, blob) in got.items()}


def sparsity(ratio, t, total, start, end):
    """Zhu and Gupta's s_t from s_i = 0: ratio * (1 - (1 - (t - t0) / (t1 - t0))^3), clamped."""
    t0, t1 = start * total, end * total
    p = min(1.0, max(0.0, (t - t0) / (t1 - t0)))
    return ratio * (1 - (1 - p) ** 3)


def torch_mask(w, amount, rows):
    """torch's mask of w [in, out] (as dmc stores x @ w's weight): rows prunes output channels,
    w's columns (dim 1), by their L2 norm."""
    module = torch.nn.Linear(1, 1)
    module.weight = torch.nn.Parameter(torch.from_numpy(w.copy()))
    if rows:
        prune.ln_structured(module, "weight", amount=amount, n=2, dim=1)
    else:
        prune.l1_unstructured(module, "weight", amount=amount)
    return module.weight_mask.numpy()


def masks_against_torch(dmc, tmp, data, rows):
    how = ":rows" if rows else ""
    model = small_mlp(tmp, "frozen" + how[1:], "optimizer sgd(lr = 1e-30)")
    t = Trainer(dmc, model, tmp, data, ["--prune", "0.6" + how, "--prune-start", "0.25", "--prune-end", "1"],
                "frozen" + how[1:])
    rng = np.random.default_rng(3)
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    init_path = os.path.join(tmp, "init.safetensors")
    write_safetensors(init_path, {k: ("F32", list(v.shape), v.tobytes()) for k, v in init.items()}, {})
    ckpt = os.path.join(tmp, "frozen-ckpt" + how[1:])
    r = t.run(["--steps", "4", "--init", init_path, "--checkpoint", ckpt, "--checkpoint-every", "1"])
    check(r.returncode == 0, "4 pruned steps at lr 1e-30 run (%s)" % r.stderr.strip()[-300:])
    if r.returncode != 0:
        return
    for step in range(1, 5):
        got = tensors(os.path.join(ckpt, "step-%08d.safetensors" % step))
        amount = sparsity(0.6, step, 4, 0.25, 1.0)
        for name in WEIGHTS:
            mask = torch_mask(init[name], amount, rows)
            same_w = np.array_equal(got[name], init[name] * mask)
            same_m = np.array_equal(got[name + ".prune_mask"], 1 - mask)
            check(same_w and same_m, "step %d: %s pruned as %s(amount=%.4f): %d of %d zero (torch %d)"
                  % (step, name, "ln_structured" if rows else "l1_unstructured", amount, int((got[name] == 0).sum()),
                     mask.size, int((mask == 0).sum())))
        biases = all(np.array_equal(got[k], init[k]) for k in SHAPES if k.endswith("bias"))
        check(biases and not any(k.startswith("fc") and k.endswith("bias.prune_mask") for k in got),
              "step %d: the biases are not pruned and have no mask" % step)


def adamw_mlp(tmp, data, name, mesh):
    model = small_mlp(tmp, name, "optimizer adamw(lr = 1e-2, weight_decay = 1e-4)")
    return Trainer(dmc_path, model, tmp, data, mesh + ["--prune", "0.5", "--prune-end", "0.5"], name)


def stays_zero(t, tmp):
    ckpt = os.path.join(tmp, "adamw-ckpt")
    r = t.run(["--steps", "8", "--checkpoint", ckpt, "--checkpoint-every", "4"])
    check(r.returncode == 0, "8 pruned AdamW steps run (%s)" % r.stderr.strip()[-300:])
    if r.returncode != 0:
        return
    at4, at8 = (tensors(os.path.join(ckpt, "step-%08d.safetensors" % s)) for s in (4, 8))
    for name in WEIGHTS:
        mask = at4[name + ".prune_mask"] != 0
        n = mask.size
        check(int(mask.sum()) == round(0.5 * n) and np.array_equal(at8[name + ".prune_mask"], at4[name + ".prune_mask"]),
              "%s: %d of %d pruned at step 4 (the ramp's end), the mask unchanged at step 8" % (name, int(mask.sum()), n))
        check(np.all(at8[name][mask] == 0) and np.all(at4[name][mask] == 0) and not np.array_equal(at8[name], at4[name]),
              "%s: the pruned weights are exactly 0 after four more updates, the others moved" % name)


def straight_vs_resumed(t, tmp):
    tag = re.sub(r"\W+", "_", t.name)
    straight, resumed = os.path.join(tmp, tag + "-straight.st"), os.path.join(tmp, tag + "-resumed.st")
    ckpt = os.path.join(tmp, tag + "-ckpt")
    a = t.run(["--steps", "8", "--save", straight])
    b1 = t.run(["--steps", "8", "--checkpoint", ckpt, "--checkpoint-every", "3"])
    b2 = t.run(["--steps", "8", "--resume", os.path.join(ckpt, "step-00000003.safetensors"), "--save", resumed])
    ok = a.returncode == 0 and b1.returncode == 0 and b2.returncode == 0
    check(ok, "%s: 8 pruned steps, and 3 + --resume + 5, run (%s)" % (t.name, (a.stderr + b1.stderr + b2.stderr)[-300:]))
    if ok:
        w = tensors(straight)
        zeros = [int((w[k] == 0).sum()) for k in WEIGHTS]
        check(open(straight, "rb").read() == open(resumed, "rb").read() and zeros == [25088, 2048, 320],
              "%s: resumed mid-ramp gives the straight run's weights bitwise (zeros %s)" % (t.name, zeros))


TEXT = "text:/usr/share/games/fortunes/cookie"
GPT_SETS = ["--set", "V=256,T=16,C=32,NH=4,L=2,B=4"]
LLAMA_SETS = ["--set", "B=2,T=16,V=256,C=32,NH=4,NKV=2,F=48,L=1"]


def explain_pruned(dmc, model, sets, args):
    """The weights --explain=json lists as pruned, or None when --explain fails."""
    r = subprocess.run([dmc, "--explain=json", model] + sets + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    return json.loads(r.stdout)["prune"]["weights"] if r.returncode == 0 else None


def run_saved(dmc, model, sets, args, tmp, name):
    """4 steps of model (its own optimizer) on the cookie fortunes, pruned to the ratio over the
    first two; the saved weights, or None when the run failed."""
    path = os.path.join(tmp, name + ".st")
    r = subprocess.run([dmc, "run", model] + sets + args + ["--", "--data", TEXT, "--steps", "4", "--save", path,
                                                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=300)
    check(r.returncode == 0, "%s: 4 steps run (%s)" % (name, r.stderr.strip()[-300:]))
    return tensors(path) if r.returncode == 0 else None


def gpt_tied_embedding(dmc, tmp):
    """gpt.dm's head reads transpose(wte.weight), which the embedding's gather also reads: the
    table is not pruned, by elements or by :rows; the other weights are, half of each."""
    model = os.path.join(ROOT, "examples", "gpt.dm")
    plain = run_saved(dmc, model, GPT_SETS, [], tmp, "gpt-unpruned")
    want = {"": ["h.%d.%s.weight" % (l, n) for l in range(2) for n in ("attn.c_proj", "mlp.c_fc", "mlp.c_proj")],
            ":rows": ["h.%d.%s.weight" % (l, n) for l in range(2)
                      for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]}
    for how in ("", ":rows"):
        args = ["--prune", "0.5" + how, "--prune-end", "0.5"]
        listed = explain_pruned(dmc, model, GPT_SETS, args)
        check(listed is not None and "wte.weight" not in listed and sorted(listed) == sorted(want[how]),
              "gpt --prune 0.5%s: --explain lists %s (not wte.weight, read by the embedding's gather)" % (how, listed))
        w = run_saved(dmc, model, GPT_SETS, args, tmp, "gpt-pruned" + how[1:])
        if w is None or plain is None:
            continue
        wte = w["wte.weight"]
        zero_rows = int((~wte.any(axis=1)).sum())
        check(int((wte == 0).sum()) == int((plain["wte.weight"] == 0).sum()) and zero_rows == 0,
              "gpt --prune 0.5%s: wte.weight %s has %d zeros (the unpruned run's %d), %d all-zero rows (token "
              "embeddings and logits lost)" % (how, list(wte.shape), int((wte == 0).sum()),
                                               int((plain["wte.weight"] == 0).sum()), zero_rows))
        half = [(k, int((w[k] == 0).sum()), w[k].size) for k in want[how]]
        check(all(z == round(0.5 * n) for _, z, n in half),
              "gpt --prune 0.5%s: the other weights half zero (%s)" % (how, ", ".join("%s %d/%d" % h for h in half)))


def llama_transposed(dmc, tmp):
    """llama.dm's nn.Linear weights are read x @ transpose(W), a transpose folded into the
    product: --compact keeps them ("read transposed"), so :rows must not prune them."""
    model = os.path.join(ROOT, "examples", "llama.dm")
    args = ["--prune", "0.5:rows", "--prune-end", "0.5"]
    listed = explain_pruned(dmc, model, LLAMA_SETS, args)
    w = run_saved(dmc, model, LLAMA_SETS, args, tmp, "llama-rows")
    if listed is None or w is None:
        check(False, "llama: --explain and the run give results")
        return
    r = subprocess.run([dmc, "--explain", model] + LLAMA_SETS + ["--compact", os.path.join(tmp, "llama-rows.st")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    kept = re.findall(r"^\s+(\S+)\s+(\d+) channels kept: read transposed$", r.stdout, flags=re.M)
    transposed = [k for k, _ in kept]
    check(r.returncode == 0 and len(transposed) == 4, "llama: --compact keeps 4 weights as read transposed (%s)"
          % transposed)
    # x @ transpose(W): the output channels are W's rows (it counted W's columns, the inputs)
    wrong = [(k, n, w[k].shape) for k, n in kept if k in w and int(n) != w[k].shape[0]]
    check(not wrong, "llama --explain --compact: a weight read transposed has its rows as channels (%s)" % wrong)
    bad = [k for k in transposed if k in listed or not w[k].any(axis=0).all() or not w[k].any(axis=1).all()]
    check(not bad, "llama --prune 0.5:rows: no weight read transposed (%s) is pruned, by --explain (%s) or "
          "in the run's weights (all-zero rows or columns: %s)" % (transposed, listed, bad))


def refused(dmc, tmp, data):
    model = small_mlp(tmp, "refused", "optimizer adamw(lr = 1e-2)")
    out = os.path.join(tmp, "refused-out")
    cases = [
        (["--prune", "1"], "--prune expects the fraction"),
        (["--prune", "-0.1"], "--prune expects the fraction"),
        (["--prune", "half"], "--prune expects the fraction"),
        (["--prune", "0.5:cols"], "--prune expects the fraction"),
        (["--prune-start", "0.2"], "only apply with --prune"),
        (["--prune", "0.5", "--prune-start", "0.8", "--prune-end", "0.5"], "must come before --prune-end"),
        (["--prune", "0.5", "--prune-end", "1.5"], "--prune-end expects a fraction"),
        (["--prune", "0.5", "--mesh", "data=2", "--zero", "1"], "--prune: ZeRO"),
        (["--prune", "0.5", "--mesh", "tensor=2"], "--prune: a weight matrix split over a mesh axis"),
        (["--prune", "0.5", "--mesh", "data=2", "--param-servers", "1"], "--prune: the parameter servers update"),
    ]
    for args, want in cases:
        r = subprocess.run([dmc, model, "-o", out] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=120)
        written = os.path.isdir(out) and os.listdir(out)
        check(r.returncode != 0 and want in r.stderr and not written,
              "dmc %s: refused (%s), nothing written" % (" ".join(args), r.stderr.strip()[-160:]))
        shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([dmc, "run", model, "--prune", "2", "--steps", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    check(r.returncode != 0 and "--prune expects" in r.stderr, "dmc run --prune 2: refused before compiling")
    r = subprocess.run([dmc, "--explain", model, "--prune", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    check(r.returncode == 0 and re.search(r"prun\w+ 0\.5", r.stdout) is not None and "fc1.weight" in r.stdout,
          "--explain says what --prune prunes")


def main():
    global dmc_path
    dmc_path = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-prune-")
    try:
        data = fashion_like(tmp)
        masks_against_torch(dmc_path, tmp, data, rows=False)
        masks_against_torch(dmc_path, tmp, data, rows=True)
        serial = adamw_mlp(tmp, data, "serial", [])
        stays_zero(serial, tmp)
        straight_vs_resumed(serial, tmp)
        straight_vs_resumed(adamw_mlp(tmp, data, "data2", ["--mesh", "data=2"]), tmp)
        straight_vs_resumed(adamw_mlp(tmp, data, "pipeline2", ["--mesh", "pipeline=2", "--microbatches", "2"]), tmp)
        refused(dmc_path, tmp, data)
        gpt_tied_embedding(dmc_path, tmp)
        llama_transposed(dmc_path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % test_checkpoint.failures)
    sys.exit(1 if test_checkpoint.failures else 0)


if __name__ == "__main__":
    main()
