#!/usr/bin/env python3
"""test_trace_prediction.py DMC: `dmc run --trace` prints what `dmc --explain` predicted
for the same plan on the same hardware, beside what it measures.

For mlp.dm on one rank and on pipeline=2 (4 micro-batches, 1F1B) with --hardware
cpu-2core: the trace's "predicted X ms on cpu-2core" is --explain=json's
predicted.step_seconds; on the pipeline, each stage's predicted forward and backward
are the plan's stage times and the predicted bubble its simulated one; the measured
step, stage times and bubble are printed as positive numbers. (How close prediction
and measurement are is bench/predicted_vs_measured.py's: wall-clock time is no oracle
for a test.) Prints one line per check; exits 1 on any failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples/mlp.dm")


def main(argv):
    dmc = argv[1]
    fails, checks = [], 0

    def check(ok, what):
        nonlocal checks
        checks += 1
        print("%s %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            fails.append(what)

    with tempfile.TemporaryDirectory(prefix="dmc-trace-") as tmp:
        for mesh in ([], ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"]):
            plan_args = ["--hardware", "cpu-2core"] + mesh + [MLP]
            r = subprocess.run([dmc, "--explain=json"] + plan_args, stdout=subprocess.PIPE, universal_newlines=True)
            plan = json.loads(r.stdout)
            r = subprocess.run([dmc, "run"] + plan_args + ["--steps", "6", "--quiet", "--trace",
                                                          os.path.join(tmp, "t.json")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
            what = "mlp %s" % (" ".join(mesh) or "serial")
            step = re.search(r"step time ([0-9.]+) ms measured \(median of 5 steps.*predicted ([0-9.]+) ms on cpu-2core",
                             r.stdout)
            want = plan["predicted"]["step_seconds"] * 1e3
            check(r.returncode == 0 and step and float(step.group(1)) > 0 and abs(float(step.group(2)) - want) < 1e-3,
                  "%s: step line %s, --explain %.3f ms" % (what, step.group(0) if step else r.stdout[-500:], want))
            if not mesh:
                continue
            stages = re.findall(r"stage (\d): forward ([0-9.]+) ms, backward ([0-9.]+) ms per micro-batch measured, "
                                r"predicted ([0-9.]+) ms and ([0-9.]+) ms", r.stdout)
            planned = plan["pipeline"]["stage"]
            check(len(stages) == 2 and all(
                float(f) > 0 and float(b) > 0 and abs(float(pf) - 1e3 * planned[int(s)]["forward_seconds"]) < 1e-3 and
                abs(float(pb) - 1e3 * planned[int(s)]["backward_seconds"]) < 1e-3 for s, f, b, pf, pb in stages),
                "%s: stage lines %s against --explain's %s" % (what, stages, [(1e3 * s["forward_seconds"],
                                                                              1e3 * s["backward_seconds"]) for s in planned]))
            bubble = re.search(r"pipeline bubble ([0-9.]+) measured .* predicted ([0-9.]+) on cpu-2core", r.stdout)
            check(bubble and abs(float(bubble.group(2)) - plan["predicted"]["bubble"]) < 1e-4,
                  "%s: bubble line %s, --explain %.4f" % (what, bubble.group(0) if bubble else "missing",
                                                         plan["predicted"]["bubble"]))
    print("%d passed, %d failed" % (checks - len(fails), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
