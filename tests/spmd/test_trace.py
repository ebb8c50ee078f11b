"""test_trace.py DMC SRCROOT: `dmc run --trace` on a pipeline.

Trains examples/mlp.dm (small sizes) for 3 steps on data=2 x pipeline=2 with 4
micro-batches, once per schedule, with --trace, and checks against the schedule's
definition (independent of passes/schedule.c):
  - the trace is JSON in Chrome's format: one named row per rank ("rank R (stage S)",
    S from the mesh's row-major order), complete events ("ph": "X") with ts and dur;
  - each rank's actions of every step, in time order, are its stage's order: GPipe all
    forwards then all backwards; 1F1B P - s - 1 forwards, then one forward one backward,
    then the remaining backwards; micro-batches in order; no two actions of a rank overlap;
  - the trainer prints the bubble formula for P=2, M=4 (1/5) and a measured bubble in
    [0, 1); the .svg is well-formed XML.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

P, M, STEPS = 2, 4, 3


def expected_order(kind, stage):
    warmup = M if kind == "gpipe" else min(P - stage - 1, M)
    order, f, b = [], 0, 0
    while f < warmup:
        order.append("F%d" % f)
        f += 1
    while f < M:
        order += ["F%d" % f, "B%d" % b]
        f += 1
        b += 1
    while b < M:
        order.append("B%d" % b)
        b += 1
    return order


def check(dmc, root, tmp, kind):
    trace = os.path.join(tmp, "t-%s.json" % kind)
    cmd = [dmc, "run", os.path.join(root, "examples/mlp.dm"), "--set", "B=16,H=64",
           "--mesh", "data=2,pipeline=2", "--microbatches", str(M), "--schedule", kind,
           "--data-dir", "/usr/share/datasets/fashion-mnist", "--steps", str(STEPS), "--quiet", "--trace", trace]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return ["%s: `%s` exited %d:\n%s%s" % (kind, " ".join(cmd), out.returncode, out.stdout, out.stderr)]
    errors = []
    bubble = [line.split() for line in out.stdout.splitlines() if line.startswith("pipeline bubble")]
    if len(bubble) != 1:
        errors.append("%s: no 'pipeline bubble' line in:\n%s" % (kind, out.stdout))
    else:
        measured, formula = float(bubble[0][2]), float(bubble[0][9])
        if abs(formula - (P - 1) / (M + P - 1)) > 1e-4 or not 0 <= measured < 1:
            errors.append("%s: bubble line %r" % (kind, " ".join(bubble[0])))
    events = json.load(open(trace))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    ranks = 2 * P  # data=2 x pipeline=2: pipeline varies fastest
    for r in range(ranks):
        stage = r % P
        if names.get(r) != "rank %d (stage %d)" % (r, stage):
            errors.append("%s: rank %d is named %r" % (kind, r, names.get(r)))
        mine = sorted((e for e in events if e["ph"] == "X" and e["tid"] == r), key=lambda e: e["ts"])
        for step in range(1, STEPS + 1):
            actions = [e for e in mine if e["args"]["step"] == step]
            got = [e["name"] for e in actions]
            if got != expected_order(kind, stage):
                errors.append("%s: rank %d step %d ran %s, the schedule says %s"
                              % (kind, r, step, got, expected_order(kind, stage)))
            for a, b in zip(actions, actions[1:]):
                if a["ts"] + a["dur"] > b["ts"] + 1e-3:
                    errors.append("%s: rank %d: %s and %s overlap" % (kind, r, a["name"], b["name"]))
    svg = os.path.splitext(trace)[0] + ".svg"
    try:
        ElementTree.parse(svg)
    except (OSError, ElementTree.ParseError) as e:
        errors.append("%s: %s: %s" % (kind, svg, e))
    return errors


def main():
    dmc, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        print("SKIP: dataset-fashion-mnist is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="dmc-trace-")
    failures = 0
    try:
        for kind in ("gpipe", "1f1b"):
            errors = check(dmc, root, tmp, kind)
            for e in errors:
                print("FAIL %s" % e)
            failures += bool(errors)
            if not errors:
                print("%s: every rank ran its stage's order in each of %d steps" % (kind, STEPS))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (2 - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
