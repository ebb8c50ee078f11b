#!/usr/bin/env python3
"""techniques.py: step time and memory per parallel-training technique on one model.

Trains the same small GPT (examples/gpt.dm at SIZES, Adam-W, a fortune-cookie corpus) a
few steps under each technique dmc has, on 2 thread ranks (1 for the serial reference; this
machine has 2 cores), and prints one table: the measured median ms/step (the steps after
the first), the step --explain predicts for the plan on --hardware, the largest rank's
measured model peak (`dmc run --memory`) and --explain's predicted peak, each technique's
bytes sent per rank and step (--explain, ring algorithms) and its ratios to plain data
parallelism. The rows are one table: compare within it, not with tables of other runs.

    /usr/bin/python3 bench/techniques.py [--dmc build/driver/dmc] [--steps 12] [--hardware cpu-2core]
        [--only SUBSTRING]

A row whose plan the compiler refuses prints the reason instead of numbers.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPT = os.path.join(ROOT, "examples/gpt.dm")
SIZES = "V=256,T=128,C=128,NH=4,L=4,B=8"
CORPUS = "/usr/share/games/fortunes/cookie"
PIPE = ["--microbatches", "4"]

# (technique, dmc arguments); the first data-parallel row is the reference of the ratios
ROWS = [
    ("serial (1 rank)", []),
    ("data parallel", ["--mesh", "data=2"]),
    ("data + ZeRO 1", ["--mesh", "data=2", "--zero", "1"]),
    ("data + ZeRO 2", ["--mesh", "data=2", "--zero", "2"]),
    ("data + ZeRO 3 (1 MiB buckets)", ["--mesh", "data=2", "--zero", "3", "--bucket-mb", "1"]),
    ("data + bf16 gradients", ["--mesh", "data=2", "--compress", "bf16"]),
    ("data + top-k 1%", ["--mesh", "data=2", "--compress", "topk:0.01"]),
    ("data + PowerSGD rank 4", ["--mesh", "data=2", "--compress", "powersgd:4"]),
    ("data + recompute full", ["--mesh", "data=2", "--recompute", "full"]),
    ("data + recompute selective", ["--mesh", "data=2", "--recompute", "selective"]),
    ("tensor (Megatron)", ["--mesh", "tensor=2"]),
    ("tensor + sequence parallel", ["--mesh", "tensor=2", "--sequence-parallel"]),
    ("pipeline GPipe, M=4", ["--mesh", "pipeline=2", "--schedule", "gpipe"] + PIPE),
    ("pipeline 1F1B, M=4", ["--mesh", "pipeline=2", "--schedule", "1f1b"] + PIPE),
    ("pipeline interleaved v=2, M=4", ["--mesh", "pipeline=2", "--schedule", "interleaved", "--chunks", "2"] + PIPE),
    ("pipeline PipeDream-2BW, M=4", ["--mesh", "pipeline=2", "--schedule", "2bw"] + PIPE),
    ("pipeline PipeDream (weight stashing), M=4", ["--mesh", "pipeline=2", "--schedule", "pipedream"] + PIPE),
    ("data + 2 parameter servers", ["--mesh", "data=2", "--param-servers", "2"]),
    ("data + 2 parameter servers, async K=1", ["--mesh", "data=2", "--param-servers", "2", "--ps-staleness", "1"]),
]


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)


def measure(dmc, args, steps, hardware):
    base = [GPT, "--set", SIZES] + args
    plan = run([dmc, "--explain=json", "--hardware", hardware] + base)
    if plan.returncode != 0:
        errors = [l for l in plan.stdout.splitlines() if "error:" in l]
        return {"error": errors[0].split("error:", 1)[1].strip() if errors else "refused"}
    plan = json.loads(plan.stdout)
    r = run([dmc, "run"] + base + ["--data", "text:" + CORPUS, "--steps", str(steps), "--memory", "--quiet"])
    if r.returncode != 0:
        return {"error": (r.stdout.strip().splitlines() or ["failed"])[-1]}
    ms = [float(m) for m in re.findall(r"^step \d+ loss \S+ ms ([0-9.]+)", r.stdout, re.M)][1:]
    peaks = [int(b) for b in re.findall(r"^memory rank \d+: model peak (\d+) bytes", r.stdout, re.M)]
    sent = plan.get("communication", {}).get("sent_bytes_per_rank", 0)
    if "param_servers" in plan:  # a worker pushes its gradients instead of allreducing them
        sent = plan["param_servers"]["worker_sends_bytes"]
    return {"ms": statistics.median(ms), "predicted_ms": 1e3 * plan["predicted"]["step_seconds"],
            "peak": max(peaks), "predicted_peak": plan["memory_bytes_per_rank"]["peak_bytes_per_rank"],
            "sent": sent}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dmc", default=os.path.join(ROOT, "build/driver/dmc"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--hardware", default="cpu-2core")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    mib = 1024.0 * 1024.0
    print("examples/gpt.dm --set %s, 2 thread ranks, %d steps (median of the last %d), load %.1f" %
          (SIZES, a.steps, a.steps - 1, os.getloadavg()[0]))
    print("| technique | ms/step | predicted | vs data | model peak MiB (largest rank) | predicted | vs data | "
          "sent per rank and step |")
    print("|---|---|---|---|---|---|---|---|")
    ref = None
    for name, args in ROWS:
        if a.only and a.only not in name:
            continue
        m = measure(a.dmc, args, a.steps, a.hardware)
        if "error" in m:
            print("| %s | refused: %s | | | | | | |" % (name, m["error"][:100]))
            continue
        if ref is None and name == "data parallel":
            ref = m
        ratio = lambda k: "%.2fx" % (m[k] / ref[k]) if ref and ref[k] else "-"
        print("| %s | %.1f | %.1f | %s | %.2f | %.2f | %s | %.2f MiB |" %
              (name, m["ms"], m["predicted_ms"], ratio("ms"), m["peak"] / mib, m["predicted_peak"] / mib,
               ratio("peak"), m["sent"] / mib))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
