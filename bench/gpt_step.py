#!/usr/bin/python3
"""gpt_step.py: training steps of examples/gpt.dm (GPT-2), dmc vs PyTorch (CPU).

usage: bench/.venv/bin/python bench/gpt_step.py --dmc BUILD/driver/dmc [--runs N] [--threads 1,2]
           [--configs tiny,mid,big] [--mid V=256,T=256,C=256,NH=8,L=4,B=8] [--steps N]
           [--variants explicit,sdpa,compile] [--precision fp32|bf16] [--dmc-arg=ARG ...]
       (bench/.venv: PyTorch 2.x, made by `sh bench/setup_torch.sh`; /usr/bin/python3 runs
       it with Debian's torch 1.13, which has neither SDPA nor torch.compile: those
       variants are then skipped)

Configs (each a `--set` of gpt.dm's dims; default tiny,mid):
  tiny  V=64,T=16,C=32,NH=4,L=2,B=4          28,032 parameters, dmc step well under 1 ms
  mid   V=256,T=256,C=256,NH=8,L=4,B=8       3,290,624 parameters
  big   V=512,T=128,C=384,NH=6,L=6,B=8       10,893,312 parameters
Data:    random tokens (numpy, seed 0) in a batch file, one slice per step
         (tokens/targets i32 [S, B, T], written with tests/ref/stio.py); both sides train
         on the same slices in the same order.
dmc:     `dmc run examples/gpt.dm --set ... --batch-file F --init W --steps N --quiet`, plus
         each --dmc-arg (e.g. --dmc-arg=--no-fuse-attention: the attention unfused);
         W is the model's own initialisation (`--steps 0 --save W`, run once per config,
         which also prints the parameter count). Step time: the trainer's
         `step <n> loss <x> ms <y> ... blas_ms <z>` lines (y = milliseconds of train_step,
         z = of it inside dmrt_sgemm: DMRT_BLAS_TIME=1, docs/trainer.md). BLAS share: the
         sum of z over the sum of y, measured steps of the best run.
PyTorch: the same architecture written out in plain torch, float32, loaded from W:
         token + position embedding, L pre-LN blocks (layer_norm eps 1e-5; fused qkv
         projection x @ W + b with W [in, out], computed with addmm as nn.Linear does;
         causal attention; GELU tanh approximation; 4C MLP), final layer_norm, head tied to
         wte, mean cross-entropy, AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8,
         weight_decay 0.01; fused, one kernel, on torch 2.4+). A step is timed from
         zero_grad(set_to_none=True) to the end of opt.step(). Variants of the attention:
           explicit  q @ k^T / sqrt(hs), masked_fill(-inf), softmax, @ v (eager)
           sdpa      F.scaled_dot_product_attention(is_causal=True) (eager; torch 2.0+)
           compile   the sdpa loss under torch.compile (inductor: generated C++ for the
                     CPU, forward and backward); it compiles in the warm-up steps
Per run: N measured steps after 2 warm-up steps (not counted), the median of the N step
         times. With --runs R the sides alternate R times and the best median of each is
         reported (use it on a busy machine); each run's own ratio (its sides measured
         within a minute) is printed too, with their median: the machine's speed drifts by
         10 to 20% over minutes, and one run's sides drift together.
Check:   the parameter counts must agree, and every variant's losses, started from dmc's
         weights on the same batches, must follow dmc's (max relative difference printed;
         the script fails above 1e-3).
Precision (--precision, default fp32):
  fp32     dmc and every PyTorch variant in float32, as above.
  bf16     three kinds of side in the same run: dmc fp32 (`dmc run` as above), dmc bf16
           (the same with `--precision bf16`: every product's operands rounded to bf16,
           sums, master weights and the rest f32; docs/precision.md), and each PyTorch
           variant under torch.autocast("cpu", dtype=torch.bfloat16) around the loss
           (compile: the autocast loss compiled whole), backward and AdamW outside it.
           Checks: dmc bf16's and every autocast variant's losses must follow dmc fp32's
           and dmc bf16's within BF16_LOSS_RTOL (2e-2 relative, each step; autocast also
           stores each product's result, and SDPA its whole attention, in bf16, where dmc
           keeps f32). Prints dmc fp32 / dmc bf16 (the speed-up of bf16) and best torch
           bf16 / dmc bf16.
Threads: each count of --threads (default 1,2) for both sides in turn:
         benchlib.dmc_thread_env for dmc (DMC_THREADS),
         torch.set_num_threads for torch (compiled code is compiled again for each count);
         both with GOMP_SPINCOUNT=3000, the trainer's default wait, unless the environment sets
         OMP_WAIT_POLICY or GOMP_SPINCOUNT (bench/benchlib.py says why).

Prints a table: per config and thread count, ms/step of dmc, its BLAS share, ms/step of
each PyTorch variant, the best of them and ratio best torch / dmc (> 1: dmc is faster).
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
import benchlib  # noqa: E402  (bench/, beside this file)

CONFIGS = {
    "tiny": "V=64,T=16,C=32,NH=4,L=2,B=4",
    "mid": "V=256,T=256,C=256,NH=8,L=4,B=8",
    "big": "V=512,T=128,C=384,NH=6,L=6,B=8",
}
STEPS = {"tiny": 100, "mid": 6, "big": 6}     # measured steps per run (after the warm-up)
WARMUP = 2
DIMS = ("V", "T", "C", "NH", "L", "B")
LOSS_RTOL = 1e-3
BF16_LOSS_RTOL = 2e-2   # --precision bf16: bf16 sides against each other and against fp32


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


def dmc_steps(args, cfg, env, precision="fp32"):
    """Returns (median ms of the measured steps, losses, share of those steps in BLAS)."""
    n = WARMUP + cfg["steps"]
    extra = ["--precision", "bf16"] if precision == "bf16" else []
    r = dmc_run(args, dmc_cmd(args, cfg, "--init", cfg["init"], "--steps", str(n), "--quiet", *extra), env)
    rows = re.findall(r"^step (\d+) loss (\S+) ms ([0-9.]+)(?: lr \S+)? blas_ms ([0-9.]+)", r.stdout, re.M)
    if len(rows) != n:
        sys.exit("gpt_step: expected %d `step N loss X ms Y ... blas_ms Z` lines from dmc, got %d:\n%s"
                 % (n, len(rows), r.stdout[-2000:]))
    benchlib.parse_blas("gpt_step", r.stdout)   # the summary line is there too
    ms = [float(row[2]) for row in rows[WARMUP:]]
    blas_share = sum(float(row[3]) for row in rows[WARMUP:]) / sum(ms)
    return statistics.median(ms), [float(row[1]) for row in rows], blas_share


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


class TorchSide:
    """One PyTorch variant of a config at the current thread count: the model (and for
    "compile" its compiled loss) is built once; each run loads dmc's initial weights into it
    and starts a fresh optimizer."""

    def __init__(self, cfg, torch, stio, variant, bf16=False):
        self.cfg, self.torch, self.variant = cfg, torch, variant
        self.init = stio.load(cfg["init"])
        self.model = TorchGPT(torch, cfg["dims"], self.init, sdpa=variant != "explicit")
        loss = self.model.loss
        if bf16:
            # CPU autocast around the forward and the loss (the backward follows the
            # forward's dtypes); compiled whole for "compile"
            def loss(tokens, targets, plain=self.model.loss):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return plain(tokens, targets)
        # compile: inductor over forward and backward (AOTAutograd), with SDPA inside
        self.loss = torch.compile(loss) if variant == "compile" else loss
        data = stio.load(cfg["batches"])
        self.tokens = [torch.from_numpy(t.astype("int64")) for t in data["tokens"]]
        self.targets = [torch.from_numpy(t.astype("int64")) for t in data["targets"]]

    def steps(self):
        """Returns (median ms of the measured steps, losses, parameter count, AdamW form)."""
        import time
        torch, model = self.torch, self.model
        with torch.no_grad():
            for name, p in model.p.items():
                p.copy_(torch.from_numpy(self.init[name]))
        opt, form = benchlib.adamw(torch, model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                   weight_decay=0.01)
        S = len(self.tokens)
        times, losses = [], []
        for i in range(WARMUP + self.cfg["steps"]):
            tk, tg = self.tokens[i % S], self.targets[i % S]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = self.loss(tk, tg)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        nparams = sum(t.numel() for t in model.parameters())
        return 1e3 * statistics.median(times[WARMUP:]), losses, nparams, form


def max_rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))


def check_losses(cfg, side, losses, ref_name, ref, rtol):
    diff = max_rel(losses, ref)
    if diff > rtol:
        sys.exit("gpt_step: %s: %s's losses %s differ from %s's %s (max rel %.2g > %g)"
                 % (cfg["name"], side, losses, ref_name, ref, diff, rtol))
    key = "%s vs %s" % (side, ref_name)
    cfg["diff"][key] = max(diff, cfg["diff"].get(key, 0.0))


def best_of_runs(args, cfg, threads, torch, stio, variants, dmc_params):
    """Alternates dmc (and under --precision bf16 dmc bf16) and every variant args.runs
    times; returns {side: best median ms}, {side: dmc's share in BLAS (of its best run)},
    the AdamW form torch used, and each run's own ratio (its best variant's ms over its dmc
    ms, bf16's under --precision bf16: sides measured within a minute of each other).
    Sides: "dmc", "dmc-bf16", the variants."""
    bf16 = args.precision == "bf16"
    env = benchlib.dmc_thread_env(os.environ, threads)
    benchlib.set_torch_threads(torch, threads)
    sides = {v: TorchSide(cfg, torch, stio, v, bf16=bf16) for v in variants}
    best, share, form, run_ratios = {}, {}, None, []
    for run in range(args.runs):
        line = "  %s, %d thread(s), run %d:" % (cfg["name"], threads, run + 1)
        this_run = {}
        for side, prec in [("dmc", "fp32")] + ([("dmc-bf16", "bf16")] if bf16 else []):
            ms, losses, blas = dmc_steps(args, cfg, env, prec)
            this_run[side] = ms
            if side not in best or ms < best[side]:
                best[side], share[side] = ms, blas
            if side == "dmc":
                dmc_losses = losses
            else:
                check_losses(cfg, side, losses, "dmc", dmc_losses, BF16_LOSS_RTOL)
                if losses[WARMUP:] == dmc_losses[WARMUP:]:
                    sys.exit("gpt_step: %s: dmc --precision bf16's losses equal fp32's: no bf16 product ran" % cfg["name"])
                bf16_losses = losses
            line += " %s %.3f ms (%.0f%% BLAS)," % (side, ms, 100 * blas)
        for v in variants:
            ms, losses, nparams, form = sides[v].steps()
            this_run[v] = ms
            best[v] = min(best.get(v, ms), ms)
            if nparams != dmc_params:
                sys.exit("gpt_step: %s: PyTorch model has %d parameters, dmc's %d" % (cfg["name"], nparams, dmc_params))
            if bf16:
                check_losses(cfg, v + " autocast", losses, "dmc-bf16", bf16_losses, BF16_LOSS_RTOL)
                check_losses(cfg, v + " autocast", losses, "dmc", dmc_losses, BF16_LOSS_RTOL)
            else:
                check_losses(cfg, v, losses, "dmc", dmc_losses, LOSS_RTOL)
            line += " %s %.3f ms," % (v + (" bf16" if bf16 else ""), ms)
        if variants:
            run_ratios.append(min(this_run[v] for v in variants) / this_run["dmc-bf16" if bf16 else "dmc"])
            line += " this run's ratio %.2fx," % run_ratios[-1]
        print(line.rstrip(","))
        sys.stdout.flush()
    return best, share, form, run_ratios


def main():
    ap = argparse.ArgumentParser(description="GPT training steps of examples/gpt.dm: dmc vs PyTorch CPU")
    ap.add_argument("--dmc", required=True, help="the dmc executable (BUILD/driver/dmc)")
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "gpt.dm"))
    ap.add_argument("--configs", default="tiny,mid", help="comma-separated: %s (default %%(default)s)"
                    % ", ".join(CONFIGS))
    for name, dims in CONFIGS.items():
        ap.add_argument("--" + name, default=dims, help="dims of the %s config (default %%(default)s)" % name)
    ap.add_argument("--steps", type=int, default=0,
                    help="measured steps per run after %d warm-up steps (default: %s)"
                    % (WARMUP, ", ".join("%s %d" % kv for kv in STEPS.items())))
    ap.add_argument("--threads", default="1,2", help="thread counts, each for both sides (default %(default)s)")
    ap.add_argument("--variants", default="explicit,sdpa,compile",
                    help="PyTorch variants: explicit, sdpa, compile (default %(default)s)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each side, alternating; the best is reported")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="fp32: all sides fp32; bf16: dmc fp32, dmc --precision bf16 and each PyTorch variant "
                         "under CPU bf16 autocast (default %(default)s)")
    ap.add_argument("--dmc-arg", action="append", default=[],
                    help="an option for every `dmc run` (repeatable), e.g. --dmc-arg=--no-fuse-attention")
    args = ap.parse_args()
    args.dmc = os.path.abspath(args.dmc)
    args.model = os.path.abspath(args.model)
    thread_counts = benchlib.parse_threads(args.threads)
    benchlib.prepare_torch_env(max(thread_counts))
    np, torch = benchlib.import_torch("gpt_step")
    import stio

    variants = []
    for v in args.variants.split(","):
        if v not in ("explicit", "sdpa", "compile"):
            sys.exit("gpt_step: unknown variant %r (explicit, sdpa, compile)" % v)
        if v == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            print("gpt_step: torch %s has no F.scaled_dot_product_attention: sdpa skipped" % torch.__version__)
        elif v == "compile" and not (benchlib.has_compile(torch)
                                     and hasattr(torch.nn.functional, "scaled_dot_product_attention")):
            print("gpt_step: torch %s has no torch.compile: compile skipped" % torch.__version__)
        else:
            variants.append(v)

    configs = []
    for name in args.configs.split(","):
        if name not in CONFIGS:
            sys.exit("gpt_step: unknown config %r (%s)" % (name, ", ".join(CONFIGS)))
        text = getattr(args, name)
        configs.append({"name": name, "set": text, "dims": parse_dims(text),
                        "steps": args.steps or STEPS[name], "diff": {}})

    print("gpt_step: %s; %s; precision %s; threads %s; median ms/step of steps %d.. per run, best of %d run(s); "
          "load average %s"
          % (os.path.relpath(args.model), benchlib.describe_torch(torch), args.precision, args.threads, WARMUP + 1,
             args.runs,
             " ".join("%.1f" % x for x in os.getloadavg())))
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
            for threads in thread_counts:
                best, share, form, run_ratios = best_of_runs(args, cfg, threads, torch, stio, variants, dmc_params)
                rows.append((cfg, dmc_params, threads, best, share, form, run_ratios))

    bf16 = args.precision == "bf16"
    me = "dmc-bf16" if bf16 else "dmc"
    hdr = "%-5s %10s %3s %10s %5s" % ("cfg", "params", "thr", "dmc ms", "BLAS")
    if bf16:
        hdr += " %10s %5s %9s" % ("bf16 ms", "BLAS", "fp32/bf16")
    hdr += "".join(" %10s" % (v + (" bf16" if bf16 else " ms")) for v in variants) + " %18s %7s" % ("best torch", "ratio")
    print(hdr)
    print("-" * len(hdr))
    for cfg, nparams, threads, best, share, form, _ in rows:
        top = min(variants, key=lambda v: best[v]) if variants else None
        line = "%-5s %10d %3d %10.3f %4.0f%%" % (cfg["name"], nparams, threads, best["dmc"], 100 * share["dmc"])
        if bf16:
            line += " %10.3f %4.0f%% %8.2fx" % (best[me], 100 * share[me], best["dmc"] / best[me])
        line += "".join(" %10.3f" % best[v] for v in variants)
        if top:
            line += " %18s %6.2fx" % ("%s %.3f" % (top, best[top]), best[top] / best[me])
        print(line)
    print("configs: %s" % "; ".join("%s %s" % (c["name"], c["set"]) for c in configs))
    if variants:
        print("each run's own ratio (best torch of the run / dmc%s of the run, its sides a minute apart; the table's "
              "ratio pairs the best of each side over the runs): %s" % (
                  " bf16" if bf16 else "",
                  "; ".join("%s %d thr %s (median %.2fx)" % (r[0]["name"], r[2], ", ".join("%.2fx" % x for x in r[6]),
                                                            statistics.median(r[6])) for r in rows)))
    if bf16:
        print("bf16: dmc --precision bf16 (fp32/bf16 = dmc fp32 ms / dmc bf16 ms: > 1, bf16 is faster); torch "
              "variants under torch.autocast(\"cpu\", dtype=torch.bfloat16); ratio against dmc bf16")
    print("ratio = best torch ms / dmc ms (> 1: dmc is faster); BLAS: the share of dmc's step in its products "
          "(DMRT_BLAS_TIME); torch: AdamW %s; explicit: q @ k^T, masked_fill, softmax, @ v; sdpa: "
          "F.scaled_dot_product_attention(is_causal=True); compile: torch.compile (inductor) of the sdpa loss"
          % (rows[0][5] if rows else "?"))
    print("check: parameter counts equal; losses from dmc's initial weights on the same batches, max relative "
          "difference (bound %g): %s" % (BF16_LOSS_RTOL if bf16 else LOSS_RTOL,
          ", ".join("%s (%d steps) %s %.1e" % (c["name"], WARMUP + c["steps"], v, x)
                      for c in configs for v, x in c["diff"].items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
