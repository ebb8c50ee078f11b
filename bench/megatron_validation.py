#!/usr/bin/env python3
"""megatron_validation.py: dmc's predicted throughput for Megatron-LM's published GPT
weak-scaling runs, next to the throughput the paper reports (issue 14, item 5).

Published numbers: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC21, arXiv:2104.04473, Table 1 (GPT, vocabulary 51,200, sequence
2048, mixed precision, A100 80GB in DGX A100 nodes of Selene). Micro-batch sizes, recomputation
and the interleaved schedule of each row: examples/sc21/run_table_1.sh and CONFIG.sh in
github.com/NVIDIA/Megatron-LM, the scripts the authors give for reproducing Table 1 (--fp16,
--activations-checkpoint-method uniform: every layer recomputed; --num-layers-per-virtual-
pipeline-stage on the 76B to 530B rows).

For each row it runs

    dmc --explain=json examples/gpt.dm --set C=h,NH=a,L=l,T=2048,V=51200,B=<global batch>
        --mesh data=d,tensor=t,pipeline=p --microbatches M --schedule 1f1b --recompute full
        --zero 0 --hardware a100-80gb-sxm --precision bf16 --no-fuse-attention

with d = GPUs / (t p) and M = B / (d micro_batch), twice: on examples/gpt.dm as it is, whose
mesh(data, tensor, pipeline) numbers ranks with the pipeline axis innermost, and on a copy in a
temporary directory whose only change is mesh(pipeline, data, tensor): Megatron-LM's rank order,
the tensor axis innermost, so that a tensor group is one node's 8 GPUs.

Like is compared with like: the paper's TFLOP/s counts F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))
flops per step (its equation 3: matrix products forward, backward and the recomputed forward),
so the predicted figure is the same F over dmc's predicted step time. dmc's own
tflops_per_device (products forward and backward, recomputed copies not counted) is printed with
a check of its flop count against the closed form 72 B s l h^2 (1 + s/(6h)) + 6 B s h V.

Then (unless --no-sensitivity) the tensor-innermost prediction again on hardware files made from
the preset with one group of costs made negligible, and (unless --no-plan) `dmc --plan=json
--devices N --global-batch B` on both files for each row, and whether the fastest plan is at
least as fast, by the model, as the published configuration.

    /usr/bin/python3 bench/megatron_validation.py [--dmc build/driver/dmc] [--quick] [--no-plan]
        [--no-sensitivity] [--plan-max-devices N] [--json FILE]

Prints markdown (docs/validation.md holds a copy and the analysis); progress goes to stderr. A
dmc command that fails puts its error in the row's cells; the script goes on, and exits 1.
"""
import argparse
import copy
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "examples", "gpt.dm")
SEQ = 2048
VOCAB = 51200
HARDWARE = "a100-80gb-sxm"
PRECISION = "bf16"
PEAK_BF16 = 312e12  # A100 dense fp16/bf16 peak, the paper's 100%
# Like with like: the 2021 runs materialised the attention scores (Megatron-LM's fused
# scale-mask-softmax kernel reads and writes all T x T of them) and the paper counts the full
# T x T products; dmc's default fused attention computes only the causal half and never
# stores the scores, which predicts a different, faster program (1.7B: 2.36 s a step against
# 2.95 s unfused, on 2026-11-24)
ATTENTION = ["--no-fuse-attention"]

# Table 1 of arXiv:2104.04473 (params in billions, attention heads, hidden size, layers, tensor-
# and pipeline-parallel size, GPUs, global batch, achieved TFLOP/s per GPU, % of peak, aggregate
# PFLOP/s), with the micro-batch size and layers per virtual pipeline stage (0: not interleaved)
# of examples/sc21/run_table_1.sh.
ROWS = [
    # name      heads hidden layers t  p   GPUs batch TF/s %peak  PF/s  mbs layers/virtual stage
    ("1.7B",     24,  2304,  24,  1,  1,   32,  512, 137,  44,   4.4,  16,  0),
    ("3.6B",     32,  3072,  30,  2,  1,   64,  512, 138,  44,   8.8,  16,  0),
    ("7.5B",     32,  4096,  36,  4,  1,  128,  512, 142,  46,  18.2,  16,  0),
    ("18.4B",    48,  6144,  40,  8,  1,  256, 1024, 135,  43,  34.6,   8,  0),
    ("39.1B",    64,  8192,  48,  8,  2,  512, 1536, 138,  44,  70.8,   4,  0),
    ("76.1B",    80, 10240,  60,  8,  4, 1024, 1792, 140,  45, 143.8,   2,  5),
    ("145.6B",   96, 12288,  80,  8,  8, 1536, 2304, 148,  47, 227.1,   2,  5),
    ("310.1B",  128, 16384,  96,  8, 16, 1920, 2160, 155,  50, 297.4,   1,  3),
    ("529.6B",  128, 20480, 105,  8, 35, 2520, 2520, 163,  52, 410.2,   1,  1),
    ("1008.0B", 160, 25600, 128,  8, 64, 3072, 3072, 163,  52, 502.0,   1,  0),
]
QUICK_MAX_GPUS = 256  # --quick: the rows without pipeline parallelism (1.7B to 18.4B)
LAYOUTS = ("as is", "tensor inner")  # examples/gpt.dm; the copy with Megatron-LM's rank order


def row_config(r):
    name, heads, hidden, layers, t, p, gpus, batch, tflops, pct, pflops, mbs, lpv = r
    d = gpus // (t * p)
    assert d * t * p == gpus and batch % (d * mbs) == 0, name
    m = batch // (d * mbs)
    v = (layers // p) // lpv if lpv else 1  # model chunks per device in the interleaved schedule
    return dict(name=name, heads=heads, h=hidden, l=layers, t=t, p=p, d=d, n=gpus, B=batch, mbs=mbs, M=m, v=v,
                published=tflops, published_pct=pct, published_pflops=pflops)


def paper_flops(c):
    """Equation 3 of the paper: flops per step, the recomputed forward included."""
    B, s, l, h, V = c["B"], SEQ, c["l"], c["h"], VOCAB
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def model_flops(c):
    """Products forward and backward without the recomputed forward (what dmc counts)."""
    B, s, l, h, V = c["B"], SEQ, c["l"], c["h"], VOCAB
    return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h)) + 6.0 * B * s * h * V


def sets(c, with_batch=True):
    s = "C=%d,NH=%d,L=%d,T=%d,V=%d" % (c["h"], c["heads"], c["l"], SEQ, VOCAB)
    return s + (",B=%d" % c["B"] if with_batch else "")


def explain_args(model, c, hardware=HARDWARE):
    return ["--explain=json", model, "--set", sets(c),
            "--mesh", "data=%d,tensor=%d,pipeline=%d" % (c["d"], c["t"], c["p"]),
            "--microbatches", str(c["M"]), "--schedule", "1f1b", "--recompute", "full", "--zero", "0",
            "--hardware", hardware, "--precision", PRECISION] + ATTENTION


def plan_args(model, c):
    return ["--plan=json", model, "--set", sets(c, with_batch=False), "--devices", str(c["n"]),
            "--global-batch", str(c["B"]), "--hardware", HARDWARE, "--precision", PRECISION, "--top", "0"] + ATTENTION


def run_dmc(dmc, args, timeout):
    """(parsed JSON or None, error text or None, seconds)."""
    t0 = time.time()
    try:
        r = subprocess.run([dmc] + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout, time.time() - t0
    except OSError as e:
        return None, str(e), time.time() - t0
    secs = time.time() - t0
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip() or "no output").splitlines()
        return None, "exit %d: %s" % (r.returncode, msg[-1] if msg else ""), secs
    try:
        return json.loads(r.stdout), None, secs
    except ValueError as e:
        return None, "bad JSON (%s)" % e, secs


def hardware_info(dmc):
    """The preset's JSON as `dmc --hardware list` prints it, or {}."""
    try:
        out = subprocess.run([dmc, "--hardware", "list"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if j.get("name") == HARDWARE:
                return j
    return {}


def version(dmc):
    try:
        return subprocess.run([dmc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=60).stdout.strip().split("\n")[0]
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def tensor_inner_copy(tmp):
    """A copy of examples/gpt.dm with mesh(pipeline, data, tensor), or None if its mesh line is not found."""
    with open(MODEL) as f:
        text = f.read()
    pat = re.compile(r"^mesh\(\s*data\s*=\s*(\d+)\s*,\s*tensor\s*=\s*(\d+)\s*,\s*pipeline\s*=\s*(\d+)\s*\)", re.M)
    if not pat.search(text):
        return None
    path = os.path.join(tmp, "gpt_tensor_inner.dm")
    with open(path, "w") as f:
        f.write(pat.sub(lambda m: "mesh(pipeline = %s, data = %s, tensor = %s)" % (m.group(3), m.group(1), m.group(2)),
                        text, count=1))
    return path


def g(x, *keys, default=None):
    for k in keys:
        if not isinstance(x, dict) or k not in x:
            return default
        x = x[k]
    return x


def gb(b):
    return "-" if b is None else "%.1f" % (b / 1e9)


def fmt(x, f="%.1f"):
    return "-" if x is None else f % x


def pct(x, ref):
    return "-" if x is None else "%+.0f%%" % (100.0 * (x - ref) / ref)


def explain(dmc, model, c, limit, timeout, product_rate):
    j, err, secs = run_dmc(dmc, explain_args(model, c), timeout)
    res = dict(seconds=secs, error=err)
    if j is None:
        return res
    pr = j.get("predicted", {})
    mem = j.get("memory_bytes_per_rank", {})
    step = pr.get("step_seconds")
    res.update(step=step, schedule=pr.get("schedule_seconds"), update=pr.get("update_seconds"),
               bubble=pr.get("bubble"), dmc_tflops=pr.get("tflops_per_device"),
               dmc_flops_device=pr.get("model_flops_per_device"), peak=mem.get("peak_bytes_per_rank"))
    stages = mem.get("peak_bytes_by_stage") or []
    if stages:
        worst = max(stages, key=lambda s: s.get("total", 0))
        res["outputs"] = worst.get("outputs")
        res["in_flight"] = worst.get("activations_in_flight")
        res["peak_wo_outputs"] = max(s.get("total", 0) - s.get("outputs", 0) for s in stages)
    F = paper_flops(c)
    if step:
        res["predicted"] = F / (step * c["n"]) / 1e12
    if res.get("dmc_flops_device"):
        res["flop_check"] = res["dmc_flops_device"] * c["n"] / model_flops(c)
        # the products the count misses, timed at the products' rate and added to the step: a first-order
        # estimate of the prediction once they are counted (None when nothing is missing)
        missing = model_flops(c) / c["n"] - res["dmc_flops_device"]
        if step and product_rate and missing > 1e-6 * res["dmc_flops_device"]:
            res["predicted_if_counted"] = F / ((step + missing / product_rate) * c["n"]) / 1e12
    if res.get("peak") is not None:
        res["fits"] = res["peak"] <= limit
    if res.get("peak_wo_outputs") is not None:
        res["fits_wo_outputs"] = res["peak_wo_outputs"] <= limit
    return res


# Hardware variants for the sensitivity table: the preset with one group of costs made negligible.
VARIANTS = [
    ("memory-bound ops free", lambda hw: hw["device"].__setitem__("memory_bandwidth", hw["device"]["memory_bandwidth"] * 1e6)),
    ("intra-node links free", lambda hw: hw["intra_node"].update(bandwidth=hw["intra_node"]["bandwidth"] * 1e6,
                                                                 latency=0)),
    ("inter-node links free", lambda hw: hw["inter_node"].update(bandwidth=hw["inter_node"]["bandwidth"] * 1e6,
                                                                 latency=0)),
]
ALL_FREE = "products, recomputation and bubble only"


def sensitivity(dmc, model, rows, hw, tmp, timeout):
    """{row name: {variant: (predicted TFLOP/s by the paper's count, bubble) or error text}}."""
    out = {}
    if not hw:
        return out
    files = []
    for i, (label, change) in enumerate(VARIANTS + [(ALL_FREE, lambda h: [f(h) for _, f in VARIANTS])]):
        h = copy.deepcopy(hw)
        h["name"] = "%s-variant-%d" % (HARDWARE, i)
        change(h)
        path = os.path.join(tmp, "hw%d.json" % i)
        with open(path, "w") as f:
            json.dump(h, f)
        files.append((label, path))
    for c in rows:
        out[c["name"]] = {}
        for label, path in files:
            j, err, _ = run_dmc(dmc, explain_args(model, c, path), timeout)
            step = g(j, "predicted", "step_seconds")
            out[c["name"]][label] = (paper_flops(c) / (step * c["n"]) / 1e12, g(j, "predicted", "bubble")) if step else err
    return out


def plan(dmc, model, c, explained_step, timeout):
    j, err, secs = run_dmc(dmc, plan_args(model, c), timeout)
    out = dict(seconds=secs, error=err)
    if j is None:
        return out
    plans = j.get("plans") or []
    out.update(searched=j.get("searched"), fit=j.get("fit"), method=j.get("method"))
    if not plans:
        out["error"] = "no plans"
        return out
    best = plans[0]
    out["best"] = best
    fitting = [x for x in plans if x.get("fits")]
    out["best_fitting"] = fitting[0] if fitting else None
    pub = [x for x in plans if x.get("mesh") == {"data": c["d"], "tensor": c["t"], "pipeline": c["p"]}
           and x.get("microbatches") == c["M"] and x.get("zero") == 0 and x.get("recompute") == "full"
           and (c["p"] == 1 or x.get("schedule") == "1f1b")]
    out["published_in_search"] = pub[0] if pub else None
    if explained_step and best.get("step_seconds") is not None:
        out["at_least_as_fast"] = best["step_seconds"] <= explained_step * (1 + 1e-9)
        out["speedup"] = explained_step / best["step_seconds"]
    return out


def describe_plan(x):
    if not x:
        return "-"
    m = x.get("mesh", {})
    parts = ["d%s t%s p%s" % (m.get("data"), m.get("tensor"), m.get("pipeline")), "M=%s" % x.get("microbatches")]
    if m.get("pipeline", 1) > 1:
        parts.append(str(x.get("schedule")))
    parts += ["zero %s" % x.get("zero"), "recompute %s" % x.get("recompute")]
    return ", ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dmc", default=os.path.join(ROOT, "build", "driver", "dmc"))
    ap.add_argument("--quick", action="store_true", help="only the rows of at most %d GPUs" % QUICK_MAX_GPUS)
    ap.add_argument("--no-plan", action="store_true", help="skip the dmc --plan comparison")
    ap.add_argument("--no-sensitivity", action="store_true", help="skip the runs on altered hardware files")
    ap.add_argument("--plan-max-devices", type=int, default=0, help="run --plan only for rows of at most N GPUs")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per dmc command (default 900)")
    ap.add_argument("--json", help="also write every number to this file")
    a = ap.parse_args()
    dmc = os.path.abspath(a.dmc)
    if not os.path.exists(dmc):
        sys.exit("megatron_validation.py: no dmc at %s (build it, or give --dmc)" % dmc)

    rows = [row_config(r) for r in ROWS if not a.quick or r[6] <= QUICK_MAX_GPUS]
    hw = hardware_info(dmc)
    limit = g(hw, "device", "memory_bytes", default=80 * 2 ** 30)
    product_rate = g(hw, "device", "peak_flops", PRECISION, default=PEAK_BF16) * g(hw, "efficiency", "matmul", default=1)
    t_start = time.time()
    n_explain = n_plan = 0
    t_explain = t_plan = 0.0

    with tempfile.TemporaryDirectory() as tmp:
        models = {"as is": MODEL, "tensor inner": tensor_inner_copy(tmp)}
        if models["tensor inner"] is None:
            print("megatron_validation.py: the mesh line of examples/gpt.dm changed; no tensor-innermost copy",
                  file=sys.stderr)
        layouts = [k for k in LAYOUTS if models[k]]
        main_layout = layouts[-1]
        for c in rows:
            for k in layouts:
                print("explain %s (%s) ..." % (c["name"], k), file=sys.stderr, flush=True)
                c[k] = explain(dmc, models[k], c, limit, a.timeout, product_rate)
                n_explain += 1
                t_explain += c[k]["seconds"]
        sens = {}
        if not a.no_sensitivity:
            print("sensitivity ...", file=sys.stderr, flush=True)
            t0 = time.time()
            sens = sensitivity(dmc, models[main_layout], rows, hw, tmp, a.timeout)
            n_explain += sum(len(v) for v in sens.values())
            t_explain += time.time() - t0
        if not a.no_plan:
            for c in rows:
                if a.plan_max_devices and c["n"] > a.plan_max_devices:
                    continue
                c["plan"] = {}
                for k in layouts:
                    print("plan %s (%d devices, %s) ..." % (c["name"], c["n"], k), file=sys.stderr, flush=True)
                    c["plan"][k] = plan(dmc, models[k], c, c[k].get("step"), a.timeout)
                    n_plan += 1
                    t_plan += c["plan"][k]["seconds"]
    total = time.time() - t_start

    p = print
    p("<!-- generated by bench/megatron_validation.py%s on %s; %s at %s -->" % (
        " --quick" if a.quick else "", datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), version(dmc),
        os.path.relpath(dmc, ROOT) if dmc.startswith(ROOT) else dmc))
    p()
    eff = g(hw, "efficiency", default={})
    p("Hardware `%s` as this dmc has it: %s; precision %s; memory per device %.1f GB (the limit for \"fits\")." % (
        HARDWARE, ", ".join("efficiency.%s %s" % (k, v) for k, v in sorted(eff.items())) or "?", PRECISION,
        limit / 1e9))
    p()
    p("### Throughput: published against predicted")
    p()
    p("TFLOP/s per GPU by the paper's count (equation 3, the recomputed forward included) over the step "
      "time. *As is*: examples/gpt.dm, pipeline axis innermost; *tensor inner*: the same program with "
      "mesh(pipeline, data, tensor), Megatron-LM's placement. The remaining columns are for tensor inner.")
    p()
    p("| model | t x p x d | GPUs | batch | micro-batch (M) | published | predicted, as is | error | "
      "predicted, tensor inner | error | step s: published / predicted | dmc tflops_per_device | "
      "dmc flop count / closed form | predicted with the uncounted products timed | "
      "bubble: dmc 1F1B / published schedule |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in rows:
        r = c[main_layout]
        cells = ["%s" % c["name"], "%d x %d x %d" % (c["t"], c["p"], c["d"]), "%d" % c["n"], "%d" % c["B"],
                 "%d (%d)" % (c["mbs"], c["M"]), "%d" % c["published"]]
        for k in LAYOUTS:
            if k not in layouts:
                cells += ["-", "-"]
            elif c[k].get("error"):
                cells += ["error: %s" % c[k]["error"].replace("|", "/"), "-"]
            else:
                cells += [fmt(c[k].get("predicted")), pct(c[k].get("predicted"), c["published"])]
        pub_step = paper_flops(c) / (c["published"] * 1e12 * c["n"])
        pub_bubble = (c["p"] - 1) / float(c["v"] * c["M"] + c["p"] - 1)
        pic = r.get("predicted_if_counted")
        cells += ["%.2f / %s" % (pub_step, fmt(r.get("step"), "%.2f")), fmt(r.get("dmc_tflops")),
                  fmt(r.get("flop_check"), "%.3f"),
                  "-" if pic is None else "%.1f (%s)" % (pic, pct(pic, c["published"])),
                  "%s / %.1f%% (%s)" % ("-" if r.get("bubble") is None else "%.1f%%" % (100 * r["bubble"]),
                                        100 * pub_bubble, "1F1B" if c["v"] == 1 else "interleaved, v=%d" % c["v"])]
        p("| " + " | ".join(cells) + " |")
    p()
    p("### Memory per device, predicted (tensor inner)")
    p()
    p("| model | peak GB | of which outputs GB | activations in flight GB | peak without outputs GB | "
      "fits | fits without outputs |")
    p("|---|---|---|---|---|---|---|")
    yn = {True: "yes", False: "no"}
    for c in rows:
        r = c[main_layout]
        if r.get("error"):
            p("| %s | error | | | | | |" % c["name"])
            continue
        p("| %s | %s | %s | %s | %s | %s | %s |" % (
            c["name"], gb(r.get("peak")), gb(r.get("outputs")), gb(r.get("in_flight")), gb(r.get("peak_wo_outputs")),
            yn.get(r.get("fits"), "-"), yn.get(r.get("fits_wo_outputs"), "-")))
    if sens:
        labels = [v[0] for v in VARIANTS] + [ALL_FREE]
        p()
        p("### Sensitivity: predicted TFLOP/s (tensor inner) with one group of costs made negligible")
        p()
        p("The preset with its memory bandwidth, or one kind of link's bandwidth (and latency 0), multiplied by "
          "10^6 in a hardware file, everything else unchanged; the last column all three at once. Tensor groups "
          "are within a node; data and pipeline groups span nodes once t x d or t x p passes 8. Bubble in "
          "parentheses.")
        p()
        p("| model | published | preset | " + " | ".join(labels) + " |")
        p("|---|---|---|" + "---|" * len(labels))
        for c in rows:
            cells = []
            for label in labels:
                v = sens.get(c["name"], {}).get(label)
                cells.append("error: %s" % v if isinstance(v, str) or v is None else
                             "%.1f (%s)" % (v[0], "-" if v[1] is None else "%.1f%%" % (100 * v[1])))
            p("| %s | %d | %s | %s |" % (c["name"], c["published"], fmt(c[main_layout].get("predicted")),
                                       " | ".join(cells)))
    planned = [c for c in rows if "plan" in c]
    if planned:
        p()
        p("### `dmc --plan` against the published configuration")
        p()
        p("Step times by the model. *Published*: the published configuration's `--explain` step; *as --plan "
          "estimates it*: the same configuration among the plans searched; *best*: the first plan printed.")
        p()
        p("| model | layout | plans searched (fit) | published s | as --plan estimates it | best plan | best s | "
          "best memory GB (fits) | best at least as fast | --plan s |")
        p("|---|---|---|---|---|---|---|---|---|---|")
        for c in planned:
            for k in layouts:
                q = c["plan"][k]
                if q.get("error"):
                    p("| %s | %s | error: %s | | | | | | | %.1f |" % (c["name"], k, q["error"].replace("|", "/"),
                                                                      q["seconds"]))
                    continue
                b, pub = q["best"], q.get("published_in_search")
                p("| %s | %s | %s (%s) | %s | %s | %s | %s%s | %s (%s) | %s | %.1f |" % (
                    c["name"], k, q.get("searched"), q.get("fit"), fmt(c[k].get("step"), "%.2f"),
                    "-" if not pub else "%.2f%s" % (pub["step_seconds"], "" if pub.get("exact") else " (estimate)"),
                    describe_plan(b), fmt(b.get("step_seconds"), "%.2f"), "" if b.get("exact") else " (estimate)",
                    gb(b.get("memory_bytes")), yn.get(b.get("fits"), "-"),
                    {True: "yes, %.2fx" % q.get("speedup", 0), False: "no"}.get(q.get("at_least_as_fast"), "-"),
                    q["seconds"]))
        fitting = [(c["name"], k, c["plan"][k].get("best_fitting")) for c in planned for k in layouts
                   if c["plan"][k].get("best_fitting")]
        p()
        if not any("best" in c["plan"][k] for c in planned for k in layouts):
            p("No --plan run succeeded.")
        elif fitting:
            p("Best plans that fit: " + "; ".join("%s (%s): %s, %.2f s" % (n, k, describe_plan(x), x["step_seconds"])
                                                    for n, k, x in fitting) + ".")
        else:
            p("No plan of any row fits the memory limit, so each best plan is the fastest of those that do not fit.")
    p()
    p("%d dmc --explain and %d dmc --plan commands; the script took %.1f s (--explain %.1f s, --plan %.1f s)." % (
        n_explain, n_plan, total, t_explain, t_plan))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(hardware=hw, rows=rows, sensitivity=sens, seconds=total), f, indent=1, default=str)
    failed = any(c[k].get("error") for c in rows for k in layouts) or \
        any(q.get("error") for c in planned for q in c["plan"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
