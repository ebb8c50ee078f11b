#!/usr/bin/env python3
"""predicted_vs_measured.py [DMC [HARDWARE.json]]: dmc's predicted step against the
measured one, on this machine (issue 14, item 3). A benchmark, not a test of the suite:
its oracle is wall-clock time, which other work on the machine moves. Run it alone:
    /usr/bin/python3 bench/predicted_vs_measured.py build/driver/dmc

`dmc calibrate --quick` describes this machine (or HARDWARE.json, when given); then mlp.dm
and a small GPT are trained for a few dozen steps with `dmc run --trace` on one rank,
data=2, tensor=2 and pipeline=2 with 4 micro-batches (GPipe and 1F1B). Each run's trace
line gives the measured step time (the median, the first step left out) beside what
--explain predicted for the same plan on the calibrated hardware:
  - the prediction is within 25% of the measurement;
  - pipelines: the measured bubble is within 5 points of the predicted one.
A case that misses is run once more before it counts as missed. Prints one line per case
and `N within, N missed`; exits 1 when any missed.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "README.md,docs/parallelism.md,docs/compiler.md"  # a corpus of bytes every checkout has
MODELS = {
    "mlp": ["examples/mlp.dm", "--steps", "60"],
    "gpt": ["examples/gpt.dm", "--set", "V=256,T=64,C=128,NH=4,L=4,B=16", "--data", "text:" + TEXT, "--steps", "40"],
}
MESHES = {
    "serial": [],
    "data=2": ["--mesh", "data=2"],
    "tensor=2": ["--mesh", "tensor=2"],
    "pipeline=2 gpipe": ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "gpipe"],
    "pipeline=2 1f1b": ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"],
}
STEP_TOLERANCE = 0.25
BUBBLE_POINTS = 0.05


def run_case(dmc, hardware, model, mesh, tmp):
    args = [dmc, "run"] + MODELS[model][:1] + ["--hardware", hardware] + MESHES[mesh] + MODELS[model][1:] + \
        ["--trace", os.path.join(tmp, "trace.json"), "--quiet"]
    r = subprocess.run(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    step = re.search(r"step time ([0-9.]+) ms measured .*predicted ([0-9.]+) ms", r.stdout)
    bubble = re.search(r"pipeline bubble ([0-9.]+) measured .*predicted ([0-9.]+)", r.stdout)
    if r.returncode != 0 or not step:
        return None, r.stdout[-2000:]
    return {"measured": float(step.group(1)), "predicted": float(step.group(2)),
            "bubble": (float(bubble.group(1)), float(bubble.group(2))) if bubble else None}, r.stdout


def verdict(result, mesh):
    ratio = result["predicted"] / result["measured"]
    ok = abs(ratio - 1) <= STEP_TOLERANCE
    text = "step predicted %.2f ms, measured %.2f ms (%+.0f%%)" % (result["predicted"], result["measured"],
                                                                   100 * (ratio - 1))
    if mesh.startswith("pipeline"):
        if not result["bubble"]:
            return False, text + "; no bubble line"
        measured, predicted = result["bubble"]
        ok = ok and abs(measured - predicted) <= BUBBLE_POINTS
        text += "; bubble predicted %.1f%%, measured %.1f%%" % (100 * predicted, 100 * measured)
    return ok, text


def main(argv):
    dmc = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(ROOT, "build/driver/dmc"))
    fails, checks = [], 0
    with tempfile.TemporaryDirectory(prefix="dmc-predicted-") as tmp:
        hardware = os.path.abspath(argv[2]) if len(argv) > 2 else os.path.join(tmp, "calibrated.json")
        if len(argv) <= 2:
            r = subprocess.run([dmc, "calibrate", "--quick", "-o", hardware], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, universal_newlines=True)
            if r.returncode != 0:
                print("FAIL dmc calibrate --quick: %s" % r.stdout[-2000:])
                print("0 passed, 1 failed")
                return 1
        for model in MODELS:
            for mesh in MESHES:
                checks += 1
                for attempt in (1, 2):
                    result, out = run_case(dmc, hardware, model, mesh, tmp)
                    if result is None:
                        ok, text = False, "run failed: " + out
                        break
                    ok, text = verdict(result, mesh)
                    if ok:
                        break
                    if attempt == 1:
                        print("     %s %s: %s; once more" % (model, mesh, text))
                print("%s %s %s: %s" % ("ok  " if ok else "FAIL", model, mesh, text), flush=True)
                if not ok:
                    fails.append((model, mesh))
    print("%d within, %d missed" % (checks - len(fails), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
