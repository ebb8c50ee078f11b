#!/usr/bin/env python3
"""test_prune_heads.py DMC: --prune RATIO:rows over attention heads (docs/compression.md,
"Attention heads").

The model is examples/gpt.dm made small (V 256, T 32, C 64, NH 4, L 2, B 4) on the text of
/usr/share/games/fortunes/cookie. Oracles: PyTorch computing the rule from the weights, the
same program run straight, and the pruned program's logits.

  - masks: with a learning rate too small to move a weight (sgd, 1e-30) the weights after update
    t are the initial ones with the mask of update t applied, so each checkpoint of a 4-step
    ramp is compared with torch: per layer, each head's L2 norm over its 16 columns of each
    of q, k and v (c_attn, [C, 3, C]) and its 16 rows of c_proj, the round(s * 4) smallest
    pruned (a stable sort: ties to the lower head), zeroed in c_attn and c_proj together;
    the MLPs' weights still per output channel (ln_structured(n=2, dim=1)); biases kept;
  - a pruned AdamW run of 8 steps and 3 + --resume + 5: bitwise-identical weights, two heads
    of each layer zero at the end;
  - that run's file compacted (--compact): two heads fewer per layer, the logits of --predict
    the pruned program's and a torch GPT-2 forward's on the compacted weights;
  - grouped-query attention (examples/llama.dm made small, NH 4, NKV 2): a kv group (a k/v head
    and its two query heads) pruned whole in q, k, v and o_proj, against torch; that file
    compacted (through RoPE and repeat_kv): one kv group fewer, the logits the pruned program's;
  - --explain lists the heads of each attention, the unit pruned; a pipeline cut inside an
    attention refused.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_checkpoint  # noqa: E402
from test_checkpoint import check, read_safetensors, write_safetensors  # noqa: E402
from test_prune import sparsity, torch_mask  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEXT = "text:/usr/share/games/fortunes/cookie"
GPT_SETS = ["--set", "V=256,T=32,C=64,NH=4,L=2,B=4"]
LLAMA_SETS = ["--set", "B=2,T=16,V=256,C=32,NH=4,NKV=2,F=48,L=1"]
NH, HS = 4, 16


def tensors(path):
    got, _ = read_safetensors(path)
    return {k: np.frombuffer(blob, dtype=np.float32).reshape(shape) for k, (dtype, shape, blob) in got.items()}


def model_with(tmp, example, name, optimizer):
    with open(os.path.join(ROOT, "examples", example)) as f:
        src = re.sub(r"^optimizer .*$", optimizer, f.read(), flags=re.M)
    path = os.path.join(tmp, name + ".dm")
    with open(path, "w") as f:
        f.write(src)
    return path


def compile_kept(dmc, model, sets, args, tmp, name):
    out = os.path.join(tmp, "build-" + name)
    r = subprocess.run([dmc, "run", model] + sets + args + ["--keep", out, "--", "--steps", "0", "--quiet", "--data", TEXT],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    if r.returncode != 0:
        sys.exit("compiling %s failed: %s" % (name, r.stderr))
    return os.path.join(out, os.path.splitext(os.path.basename(model))[0])


def run(exe, args, tmp):
    return subprocess.run([exe, "--quiet", "--data", TEXT] + args, cwd=tmp, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=300)


def random_params(dmc, model, sets, tmp, sizes, stored):
    """Random weights for every parameter of the program (shapes from --emit=ir), as stored."""
    ir = subprocess.run([dmc, "--emit=ir", "--stop-after", "lower", model] + sets, stdout=subprocess.PIPE,
                        universal_newlines=True, check=True).stdout
    rng = np.random.default_rng(5)
    w = {}
    for name, dims in re.findall(r"%\d+ (\S+) : param f32\[([^\]]*)\]", ir):
        shape = [int(sizes.get(d.split("@")[0], d.split("@")[0])) for d in dims.split(", ")]
        w[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    for name, shape in stored.items():
        for k in w:
            if k.endswith(name):
                w[k] = w[k].reshape(shape)
    path = os.path.join(tmp, os.path.basename(model) + ".init.st")
    write_safetensors(path, {k: ("F32", list(v.shape), v.tobytes()) for k, v in w.items()}, {})
    return w, path


def smallest_units(norms, count):
    """The count units of the smallest norm, ties to the lower index (a stable sort)."""
    order = torch.sort(torch.tensor(norms, dtype=torch.float64), stable=True).indices
    return set(order[:count].tolist())


def gpt_head_masks(w, layer, amount):
    """c_attn's and c_proj's masks (1 kept) of one layer: heads by their L2 norm over both."""
    qkv = w["h.%d.attn.c_attn.weight" % layer].reshape(64, 3, 64).astype(np.float64)
    proj = w["h.%d.attn.c_proj.weight" % layer].astype(np.float64)
    norms = [np.sqrt((qkv[:, :, h * HS:(h + 1) * HS] ** 2).sum() + (proj[h * HS:(h + 1) * HS, :] ** 2).sum())
             for h in range(NH)]
    pruned = smallest_units(norms, int(round(amount * NH)))
    keep = np.array([0.0 if c // HS in pruned else 1.0 for c in range(64)], dtype=np.float32)
    return (np.broadcast_to(keep, (64, 3, 64)).reshape(64, 192), np.broadcast_to(keep[:, None], (64, 64)), pruned)


def gpt_masks(dmc, tmp):
    model = model_with(tmp, "gpt.dm", "gpt", "optimizer sgd(lr = 1e-30)")
    exe = compile_kept(dmc, model, GPT_SETS, ["--prune", "0.75:rows", "--prune-start", "0.25", "--prune-end", "1"], tmp,
                       "frozen")
    init, init_path = random_params(dmc, model, GPT_SETS, tmp, {"T": 32, "V": 256, "C": 64},
                                    {"attn.c_attn.weight": (64, 192), "attn.c_attn.bias": (192,)})
    ckpt = os.path.join(tmp, "frozen-ckpt")
    r = run(exe, ["--steps", "4", "--init", init_path, "--checkpoint", ckpt, "--checkpoint-every", "1"], tmp)
    check(r.returncode == 0, "gpt: 4 pruned steps at lr 1e-30 run (%s)" % r.stderr.strip()[-300:])
    if r.returncode != 0:
        return
    for step in range(1, 5):
        got = tensors(os.path.join(ckpt, "step-%08d.safetensors" % step))
        amount = sparsity(0.75, step, 4, 0.25, 1.0)
        for layer in range(2):
            attn_keep, proj_keep, pruned = gpt_head_masks(init, layer, amount)
            ok = True
            for name, keep in (("attn.c_attn.weight", attn_keep), ("attn.c_proj.weight", proj_keep)):
                key = "h.%d.%s" % (layer, name)
                ok = ok and np.array_equal(got[key], init[key] * keep)
                ok = ok and np.array_equal(got[key + ".prune_mask"].reshape(keep.shape), 1 - keep)
            fc = "h.%d.mlp.c_fc.weight" % layer
            mask = torch_mask(init[fc], amount, True)
            ok_fc = np.array_equal(got[fc], init[fc] * mask)
            check(ok and ok_fc, "gpt step %d, layer %d: heads %s pruned (round(%.3f * 4)) in c_attn's q, k, v columns "
                  "and c_proj's rows together, as torch's norms say; c_fc per output channel" %
                  (step, layer, sorted(pruned), amount))
        biases = all(np.array_equal(got[k], init[k]) for k in init if k.endswith("bias"))
        check(biases, "gpt step %d: the biases are not pruned" % step)


def gpt_resumed(dmc, tmp):
    exe = compile_kept(dmc, os.path.join(ROOT, "examples", "gpt.dm"), GPT_SETS,
                       ["--prune", "0.5:rows", "--prune-end", "0.5"], tmp, "adamw")
    straight, resumed = os.path.join(tmp, "straight.st"), os.path.join(tmp, "resumed.st")
    ckpt = os.path.join(tmp, "adamw-ckpt")
    a = run(exe, ["--steps", "8", "--save", straight], tmp)
    b1 = run(exe, ["--steps", "8", "--checkpoint", ckpt, "--checkpoint-every", "3"], tmp)
    b2 = run(exe, ["--steps", "8", "--resume", os.path.join(ckpt, "step-00000003.safetensors"), "--save", resumed], tmp)
    ok = a.returncode == 0 and b1.returncode == 0 and b2.returncode == 0
    check(ok, "gpt: 8 pruned steps, and 3 + --resume + 5, run (%s)" % (a.stderr + b1.stderr + b2.stderr)[-300:])
    if not ok:
        return None
    w = tensors(straight)
    zero_heads = []
    for layer in range(2):
        qkv = w["h.%d.attn.c_attn.weight" % layer].reshape(64, 3, 64)
        proj = w["h.%d.attn.c_proj.weight" % layer]
        zero_heads.append([h for h in range(NH) if not qkv[:, :, h * HS:(h + 1) * HS].any()
                           and not proj[h * HS:(h + 1) * HS].any()])
    zero_cols = int((~w["h.0.attn.c_attn.weight"].reshape(64, 3, 64).any(axis=(0, 1))).sum())
    check(open(straight, "rb").read() == open(resumed, "rb").read() and [len(z) for z in zero_heads] == [2, 2]
          and zero_cols == 2 * HS, "gpt: resumed mid-ramp gives the straight run's weights bitwise; heads %s zero" % zero_heads)
    return straight


def torch_gpt(w, tokens):
    """GPT-2's forward (as examples/gpt.dm) on the weights w, each attention's head count read
    from its c_attn's width: the oracle of the compacted program's logits."""
    t = {k: torch.from_numpy(v.copy()).double() for k, v in w.items()}
    ln = torch.nn.functional.layer_norm
    x = t["wte.weight"][torch.from_numpy(tokens).long()] + t["wpe.weight"]
    n_tok = x.shape[1]
    for layer in range(2):
        p = "h.%d." % layer
        a = ln(x, (64,), t[p + "ln_1.weight"], t[p + "ln_1.bias"], 1e-5)
        qkv = a @ t[p + "attn.c_attn.weight"] + t[p + "attn.c_attn.bias"]
        width = qkv.shape[-1] // 3
        q, k, v = (qkv[..., i * width:(i + 1) * width].reshape(-1, n_tok, width // HS, HS).transpose(1, 2)
                   for i in range(3))
        att = (q @ k.transpose(-1, -2)) / np.sqrt(HS)
        att = att.masked_fill(torch.triu(torch.ones(n_tok, n_tok, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(-1, n_tok, width)
        x = x + y @ t[p + "attn.c_proj.weight"] + t[p + "attn.c_proj.bias"]
        m = ln(x, (64,), t[p + "ln_2.weight"], t[p + "ln_2.bias"], 1e-5)
        m = torch.nn.functional.gelu(m @ t[p + "mlp.c_fc.weight"] + t[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ t[p + "mlp.c_proj.weight"] + t[p + "mlp.c_proj.bias"]
    return (ln(x, (64,), t["ln_f.weight"], t["ln_f.bias"], 1e-5) @ t["wte.weight"].T).numpy()


def predict_both(dmc, model, sets, pruned, tokens, tag, tmp):
    """--predict of tokens by the pruned program and by the compacted one: the pruned logits,
    the compacted logits and the compacted weights, or None when a run failed."""
    write_safetensors(os.path.join(tmp, tag + "-tokens.st"), {"tokens": ("I32", list(tokens.shape), tokens.tobytes())}, {})
    predict = ["--predict", "--batch-file", tag + "-tokens.st", "--quiet", "--out"]
    runs = [subprocess.run([dmc, "run", model] + sets + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=300)
            for args in (["--", "--init", pruned] + predict + [tag + "-full.st"],
                         ["--compact", pruned, "--save-compacted", tag + "-small.st", "--"] + predict
                         + [tag + "-small-out.st"])]
    ok = all(r.returncode == 0 for r in runs)
    check(ok, "%s: the pruned and the compacted program predict (%s)" % (tag, "".join(r.stderr for r in runs)[-300:]))
    if not ok:
        return None
    return tuple(tensors(os.path.join(tmp, tag + suffix)) for suffix in ("-full.st", "-small-out.st", "-small.st"))


def gpt_compacted(dmc, tmp, pruned):
    """The pruned run's file compacted: two heads of four per layer gone, the logits the pruned
    program's and torch's on the compacted weights."""
    tokens = np.random.default_rng(7).integers(0, 256, (8, 32)).astype(np.int32)
    got = predict_both(dmc, os.path.join(ROOT, "examples", "gpt.dm"), GPT_SETS, pruned, tokens, "gpt", tmp)
    if not got:
        return
    full, small, c = got[0]["logits"], got[1]["logits"], got[2]
    shapes = [c["h.%d.attn.%s" % (l, n)].shape for l in range(2) for n in ("c_attn.weight", "c_attn.bias", "c_proj.weight")]
    d_pruned = float(np.max(np.abs(full - small)))
    d_torch = float(np.max(np.abs(torch_gpt(c, tokens) - small)))
    check(shapes == [(64, 96), (96,), (32, 64)] * 2 and d_pruned < 1e-5 and d_torch < 1e-4,
          "gpt compacted: c_attn [64, 96], its bias [96], c_proj [32, 64] (2 heads of 16 per layer); logits within "
          "%.1e of the pruned program's and %.1e of torch's on the compacted weights" % (d_pruned, d_torch))


def llama_gqa(dmc, tmp):
    model = model_with(tmp, "llama.dm", "llama", "optimizer sgd(lr = 1e-30)")
    exe = compile_kept(dmc, model, LLAMA_SETS, ["--prune", "0.5:rows", "--prune-end", "0.5"], tmp, "llama")
    init, init_path = random_params(dmc, model, LLAMA_SETS, tmp, {"T": 16, "V": 256, "C": 32, "F": 48}, {})
    ckpt = os.path.join(tmp, "llama-ckpt")
    r = run(exe, ["--steps", "2", "--init", init_path, "--checkpoint", ckpt, "--checkpoint-every", "2"], tmp)
    check(r.returncode == 0, "llama: 2 pruned steps run (%s)" % r.stderr.strip()[-300:])
    if r.returncode != 0:
        return
    got = tensors(os.path.join(ckpt, "step-00000002.safetensors"))
    p = "model.layers.0.self_attn."
    q, k, v, o = (init[p + n + "_proj.weight"].astype(np.float64) for n in "qkvo")  # [out, in]; o [C, NH * 8]
    hd, r_ = 8, 2   # C 32 / NH 4; two query heads per kv head
    norms = [np.sqrt((q[g * r_ * hd:(g + 1) * r_ * hd] ** 2).sum() + (k[g * hd:(g + 1) * hd] ** 2).sum()
                     + (v[g * hd:(g + 1) * hd] ** 2).sum() + (o[:, g * r_ * hd:(g + 1) * r_ * hd] ** 2).sum())
             for g in range(2)]
    g = smallest_units(norms, 1).pop()
    want = {n: init[p + n + "_proj.weight"].copy() for n in "qkvo"}
    want["q"][g * r_ * hd:(g + 1) * r_ * hd] = 0
    want["k"][g * hd:(g + 1) * hd] = 0
    want["v"][g * hd:(g + 1) * hd] = 0
    want["o"][:, g * r_ * hd:(g + 1) * r_ * hd] = 0
    same = all(np.array_equal(got[p + n + "_proj.weight"], want[n]) for n in "qkvo")
    check(same, "llama (NH 4, NKV 2): kv group %d (k/v head %d, query heads %d, %d) pruned in q, k, v and o_proj, as "
          "torch's norms say" % (g, g, 2 * g, 2 * g + 1))
    llama_compacted(dmc, model, os.path.join(ckpt, "step-00000002.safetensors"), tmp)


def llama_compacted(dmc, model, pruned, tmp):
    """The kv group removed: k and v lose a head, q and o_proj two; logits the pruned program's."""
    tokens = np.random.default_rng(9).integers(0, 256, (4, 16)).astype(np.int32)
    got = predict_both(dmc, model, LLAMA_SETS, pruned, tokens, "llama", tmp)
    if not got:
        return
    p = "model.layers.0.self_attn."
    shapes = [got[2][p + n + "_proj.weight"].shape for n in "qkvo"]
    d = float(np.max(np.abs(got[0]["logits"] - got[1]["logits"])))
    check(shapes == [(16, 32), (8, 32), (8, 32), (32, 16)] and d < 1e-5,
          "llama compacted (RoPE, repeat_kv): q [16, 32], k and v [8, 32], o_proj [32, 16]; logits within %.1e of the "
          "pruned program's" % d)


def explain(dmc):
    r = subprocess.run([dmc, "--explain", os.path.join(ROOT, "examples", "gpt.dm")] + GPT_SETS + ["--prune", "0.5:rows"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    lines = [l for l in r.stdout.splitlines() if "attention at line" in l]
    check(r.returncode == 0 and len(lines) == 2 and all("4 heads of 16" in l and "c_attn.weight (dim 2)" in l
                                                         and "c_proj.weight (dim 0)" in l for l in lines),
          "--explain lists each attention's 4 heads of 16 and its weights")
    r = subprocess.run([dmc, "--explain=json", os.path.join(ROOT, "examples", "gpt.dm")] + GPT_SETS
                       + ["--prune", "0.5:rows"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=120)
    heads = json.loads(r.stdout)["prune"].get("heads") if r.returncode == 0 else None
    want = [{"line": 68, "units": 4, "q_heads": 4, "head_size": 16,
             "weights": [{"name": "h.%d.attn.c_attn.weight" % l, "dim": 2, "per_unit": 16},
                         {"name": "h.%d.attn.c_proj.weight" % l, "dim": 0, "per_unit": 16}]} for l in range(2)]
    check(heads == want, "--explain=json: prune.heads %s" % heads)


def refused_cut(dmc, tmp):
    """A pipeline cut between an attention's q, k, v and its projection: the heads' ranking
    needs all four weights in one stage, so code generation refuses it, nothing written."""
    with open(os.path.join(ROOT, "examples", "gpt.dm")) as f:
        src = f.read().replace("pipeline = 1)", "pipeline = 2)")
    path = os.path.join(tmp, "cut.dm")
    with open(path, "w") as f:
        f.write(src + "schedule gpipe(microbatches = 2, cuts = [h.0.attn.c_attn])\n")
    out = os.path.join(tmp, "cut-out")
    r = subprocess.run([dmc, path] + GPT_SETS + ["--prune", "0.5:rows", "-o", out], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    check(r.returncode != 0 and "which a pipeline cut splits" in r.stderr and not os.path.exists(os.path.join(out, "cut.c")),
          "a pipeline cut inside an attention: --prune :rows refused (%s)" % r.stderr.strip()[-160:])


def main():
    dmc = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-prune-heads-")
    try:
        gpt_masks(dmc, tmp)
        pruned = gpt_resumed(dmc, tmp)
        if pruned:
            gpt_compacted(dmc, tmp, pruned)
        llama_gqa(dmc, tmp)
        explain(dmc)
        refused_cut(dmc, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % test_checkpoint.failures)
    sys.exit(1 if test_checkpoint.failures else 0)


if __name__ == "__main__":
    main()
