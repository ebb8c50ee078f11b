#!/usr/bin/python3
"""gpt_step.py: training steps of examples/gpt.dm (GPT-2), dmc vs PyTorch (CPU).

usage: /usr/bin/python3 bench/gpt_step.py --dmc BUILD/driver/dmc [--runs N] [--threads N]
           [--configs tiny,mid] [--mid V=256,T=256,C=256,NH=8,L=4,B=8] [--steps N]
           [--dmc-arg=ARG ...]

Configs (each a `--set` of gpt.dm's dims):
  tiny  V=64,T=16,C=32,NH=4,L=2,B=4          28,032 parameters, dmc step well under 1 ms
  mid   V=256,T=256,C=256,NH=8,L=4,B=8       3,290,624 parameters, dmc step ~0.2-2 s
Data:    random tokens (numpy, seed 0) in a batch file, one slice per step
         (tokens/targets i32 [S, B, T], written with tests/ref/stio.py); both sides train
         on the same slices in the same order.
dmc:     `dmc run examples/gpt.dm --set ... --batch-file F --init W --steps N --quiet`, plus
         each --dmc-arg (e.g. --dmc-arg=--no-fuse-attention: the attention unfused);
         W is the model's own initialisation (`--steps 0 --save W`, run once per config,
         which also prints the parameter count). Step time: the trainer's
         `step <n> loss <x> ms <y>` lines (y = milliseconds of train_step).
PyTorch: the same architecture written out in plain torch, float32, loaded from W:
         token + position embedding, L pre-LN blocks (layer_norm eps 1e-5; fused qkv
         projection x @ W + b with W [in, out], computed with addmm as nn.Linear does;
         causal attention q @ k^T / sqrt(hs), masked_fill(-inf), softmax, @ v; GELU tanh
         approximation; 4C MLP), final layer_norm, head tied to wte, mean cross-entropy,
         AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01). A step is timed
         from zero_grad(set_to_none=True) to the end of opt.step(). A second variant uses
         F.scaled_dot_product_attention(is_causal=True) where this torch has it (2.0+),
         else it is reported as n/a.
Per run: N measured steps after 2 warm-up steps (not counted), the median of the N step
         times. With --runs R the sides alternate R times and the best median of each is
         reported (use it on a busy machine).
Check:   the parameter counts must agree, and PyTorch's losses, started from dmc's weights
         on the same batches, must follow dmc's (max relative difference printed; the
         script fails above 1e-3).
Threads: OPENBLAS_NUM_THREADS (default: the CPUs this process may use), set for both
         (and DMC_THREADS to the same number for dmc, whose loops and one-thread BLAS calls
         it splits over that many threads)
         before torch is imported, torch.set_num_threads to the same number,
         OMP_WAIT_POLICY=PASSIVE unless set (see bench/mlp_epoch.py).

Prints a table: ms/step of dmc and of each PyTorch variant, and ratio torch / dmc
(> 1: dmc is faster).
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))

CONFIGS = {
    "tiny": "V=64,T=16,C=32,NH=4,L=2,B=4",
    "mid": "V=256,T=256,C=256,NH=8,L=4,B=8",
}
STEPS = {"tiny": 100, "mid": 6}     # measured steps per run (after the warm-up)
WARMUP = 2
DIMS = ("V", "T", "C", "NH", "L", "B")
LOSS_RTOL = 1e-3


def parse_dims(text):
    d = {}
    for part in text.split(","):
        name, _, val = part.partition("=")
        if name not in DIMS or not val.isdigit():
            sys.exit("gpt_step: bad config %r (want %s)" % (text, ",".join(n + "=N" for n in DIMS)))
        d[name] = int(val)
    missing = [n for n in DIMS if n not in d]
    if missing:
        sys.exit("gpt_step: config %r lacks %s" % (text, ",".join(missing)))
    if d["C"] % d["NH"]:
        sys.exit("gpt_step: config %r: C must be a multiple of NH" % text)
    return d


def dmc_cmd(args, cfg, *extra):
    return [args.dmc, "run", args.model, "--set", cfg["set"], "--batch-file", cfg["batches"]] + args.dmc_arg + list(extra)


def dmc_run(args, cmd, env):
    with tempfile.TemporaryDirectory(prefix="dmc-bench-") as tmp:
        r = subprocess.run(cmd, env=dict(env, TMPDIR=tmp), cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        sys.exit("gpt_step: `%s` failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr[-3000:]))
    return r


def dmc_prepare(args, cfg, env):
    """Writes dmc's initial weights; returns the parameter count dmc reports."""
    cfg["init"] = os.path.join(args.tmp, cfg["name"] + "-init.safetensors")
    r = dmc_run(args, dmc_cmd(args, cfg, "--steps", "0", "--save", cfg["init"]), env)
    m = re.search(r"(\d+) parameters", r.stderr)
    if not m:
        sys.exit("gpt_step: no parameter count in dmc's stderr:\n%s" % r.stderr[-2000:])
    return int(m.group(1))


def dmc_steps(args, cfg, env):
    """Returns (median ms of the measured steps, losses)."""
    n = WARMUP + cfg["steps"]
    r = dmc_run(args, dmc_cmd(args, cfg, "--init", cfg["init"], "--steps", str(n), "--quiet"), env)
    rows = re.findall(r"^step (\d+) loss (\S+) ms ([0-9.]+)", r.stdout, re.M)
    if len(rows) != n:
        sys.exit("gpt_step: expected %d `step N loss X ms Y` lines from dmc, got %d:\n%s"
                 % (n, len(rows), r.stdout[-2000:]))
    ms = [float(row[2]) for row in rows[WARMUP:]]
    return statistics.median(ms), [float(row[1]) for row in rows]


class TorchGPT:
    """gpt.dm in plain torch; parameters named and shaped as in the .dm (weights [in, out])."""

    def __init__(self, torch, d, weights, sdpa):
        self.torch, self.d, self.sdpa = torch, d, sdpa
        import torch.nn.functional as F
        self.F = F
        self.p = {name: torch.nn.Parameter(torch.from_numpy(arr.copy())) for name, arr in weights.items()}
        T = d["T"]
        self.mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def parameters(self):
        return list(self.p.values())

    @staticmethod
    def linear(torch, x, w, b):
        # x @ w + b with w [in, out], through addmm as nn.Linear does
        y = torch.addmm(b, x.reshape(-1, x.shape[-1]), w)
        return y.view(*x.shape[:-1], w.shape[1])

    def loss(self, tokens, targets):
        torch, F, p, d = self.torch, self.F, self.p, self.d
        B, T, C, NH, V = d["B"], d["T"], d["C"], d["NH"], d["V"]
        HS = C // NH
        lin = lambda x, pre: self.linear(torch, x, p[pre + ".weight"], p[pre + ".bias"])
        ln = lambda x, pre: F.layer_norm(x, (C,), p[pre + ".weight"], p[pre + ".bias"], 1e-5)
        x = F.embedding(tokens, p["wte.weight"]) + p["wpe.weight"]
        for i in range(d["L"]):
            h = "h.%d." % i
            qkv = lin(ln(x, h + "ln_1"), h + "attn.c_attn")
            q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
            if self.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(HS)
                att = F.softmax(att.masked_fill(self.mask, float("-inf")), dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + lin(y, h + "attn.c_proj")
            m = F.gelu(lin(ln(x, h + "ln_2"), h + "mlp.c_fc"), approximate="tanh")
            x = x + lin(m, h + "mlp.c_proj")
        logits = ln(x, "ln_f") @ p["wte.weight"].t()
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def torch_steps(args, cfg, torch, stio, sdpa):
    """Returns (median ms of the measured steps, losses, parameter count)."""
    import time
    model = TorchGPT(torch, cfg["dims"], stio.load(cfg["init"]), sdpa)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    data = stio.load(cfg["batches"])
    S = data["tokens"].shape[0]
    tokens = [torch.from_numpy(data["tokens"][s].astype("int64")) for s in range(S)]
    targets = [torch.from_numpy(data["targets"][s].astype("int64")) for s in range(S)]
    times, losses = [], []
    for i in range(WARMUP + cfg["steps"]):
        tk, tg = tokens[i % S], targets[i % S]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(tk, tg)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    nparams = sum(t.numel() for t in model.parameters())
    return 1e3 * statistics.median(times[WARMUP:]), losses, nparams


def max_rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser(description="GPT training steps of examples/gpt.dm: dmc vs PyTorch CPU")
    ap.add_argument("--dmc", required=True, help="the dmc executable (BUILD/driver/dmc)")
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "gpt.dm"))
    ap.add_argument("--configs", default="tiny,mid", help="comma-separated: tiny, mid (default both)")
    ap.add_argument("--tiny", default=CONFIGS["tiny"], help="dims of the tiny config (default %(default)s)")
    ap.add_argument("--mid", default=CONFIGS["mid"], help="dims of the mid config (default %(default)s)")
    ap.add_argument("--steps", type=int, default=0,
                    help="measured steps per run after %d warm-up steps (default: tiny %d, mid %d)"
                    % (WARMUP, STEPS["tiny"], STEPS["mid"]))
    ap.add_argument("--threads", type=int, default=0,
                    help="threads for both (default: OPENBLAS_NUM_THREADS, else the usable CPUs)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each side, alternating; the best is reported")
    ap.add_argument("--dmc-arg", action="append", default=[],
                    help="an option for every `dmc run` (repeatable), e.g. --dmc-arg=--no-fuse-attention")
    args = ap.parse_args()
    args.dmc = os.path.abspath(args.dmc)
    args.model = os.path.abspath(args.model)

    threads = args.threads or int(os.environ.get("OPENBLAS_NUM_THREADS") or 0) \
        or len(os.sched_getaffinity(0))
    # before torch loads OpenBLAS, which reads it once; the same for dmc's trainer
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    # dmc's ranks run on DMC_THREADS threads each (docs/runtime.md, "Cores"): OpenBLAS's
    # setting no longer reaches them
    os.environ["DMC_THREADS"] = str(threads)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # see bench/mlp_epoch.py
    try:
        import numpy as np
        import torch
        import stio
    except ImportError as e:
        sys.exit("gpt_step: needs torch and numpy (%s); run it with /usr/bin/python3" % e)
    torch.set_num_threads(threads)
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")

    configs = []
    for name in args.configs.split(","):
        if name not in CONFIGS:
            sys.exit("gpt_step: unknown config %r (tiny, mid)" % name)
        text = getattr(args, name)
        configs.append({"name": name, "set": text, "dims": parse_dims(text),
                        "steps": args.steps or STEPS[name]})

    print("gpt_step: %s, %d thread(s) (OpenBLAS and torch, OMP_WAIT_POLICY=%s), torch %s, "
          "median ms/step of steps %d.. per run, best of %d run(s)"
          % (os.path.relpath(args.model), threads, os.environ["OMP_WAIT_POLICY"], torch.__version__,
             WARMUP + 1, args.runs))
    sys.stdout.flush()

    with tempfile.TemporaryDirectory(prefix="gpt-step-") as tmp:
        args.tmp = tmp
        rows = []
        for cfg in configs:
            d = cfg["dims"]
            S = WARMUP + cfg["steps"]
            rng = np.random.default_rng(0)
            seq = rng.integers(0, d["V"], size=(S, d["B"], d["T"] + 1)).astype(np.int32)
            cfg["batches"] = os.path.join(tmp, cfg["name"] + "-batches.safetensors")
            stio.save({"tokens": seq[:, :, :-1].copy(), "targets": seq[:, :, 1:].copy()}, cfg["batches"])
            dmc_params = dmc_prepare(args, cfg, os.environ)

            variants = ["explicit"] + (["sdpa"] if has_sdpa else [])
            best = {"dmc": None}
            best.update({v: None for v in variants})
            for run in range(args.runs):
                ms, dmc_losses = dmc_steps(args, cfg, os.environ)
                best["dmc"] = ms if best["dmc"] is None else min(best["dmc"], ms)
                line = "  %s run %d: dmc %.3f ms" % (cfg["name"], run + 1, ms)
                for v in variants:
                    ms, losses, nparams = torch_steps(args, cfg, torch, stio, v == "sdpa")
                    best[v] = ms if best[v] is None else min(best[v], ms)
                    if nparams != dmc_params:
                        sys.exit("gpt_step: %s: PyTorch model has %d parameters, dmc's %d"
                                 % (cfg["name"], nparams, dmc_params))
                    diff = max_rel(losses, dmc_losses)
                    if diff > LOSS_RTOL:
                        sys.exit("gpt_step: %s: PyTorch (%s) losses %s differ from dmc's %s (max rel %.2g)"
                                 % (cfg["name"], v, losses, dmc_losses, diff))
                    cfg.setdefault("diff", {})[v] = max(diff, cfg.get("diff", {}).get(v, 0.0))
                    line += ", torch-%s %.3f ms" % (v, ms)
                if args.runs > 1:
                    print(line)
                    sys.stdout.flush()
            rows.append((cfg, dmc_params, best))

    hdr = "%-5s %-32s %10s %11s %12s %7s %12s %7s" % (
        "cfg", "dims", "params", "dmc ms", "torch ms", "ratio", "t-sdpa ms", "ratio")
    print(hdr)
    print("-" * len(hdr))
    for cfg, nparams, best in rows:
        sd = ("%12.3f %6.2fx" % (best["sdpa"], best["sdpa"] / best["dmc"])) if "sdpa" in best \
            else "%12s %7s" % ("n/a", "")
        print("%-5s %-32s %10d %11.3f %12.3f %6.2fx %s" % (
            cfg["name"], cfg["set"], nparams, best["dmc"], best["explicit"],
            best["explicit"] / best["dmc"], sd))
    print("threads %d; ratio = torch ms / dmc ms (> 1: dmc is faster); torch-sdpa: %s"
          % (threads, "F.scaled_dot_product_attention(is_causal=True)" if has_sdpa
             else "n/a, torch %s has no F.scaled_dot_product_attention" % torch.__version__))
    print("check: parameter counts equal; PyTorch's losses from dmc's initial weights on the same "
          "batches, max relative difference to dmc's: %s"
          % ", ".join("%s (%d steps) %s %.1e" % (c["name"], WARMUP + c["steps"], v, x)
                      for c, _, _ in rows for v, x in c["diff"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
