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
The same for the interleaved schedule with 2 chunks per rank (events "F0a": micro-batch 0 on
the rank's first chunk; micro-batches go through the chunks in groups of P, the backwards
from the last chunk, after (v - 1) P + 2 (P - s - 1) warm-up forwards; formula
(P-1)/(vM+P-1) = 1/9), and its measured bubble on a balanced model (tests/spmd/stack.dm on
pipeline=2, 4 stages of one block, 8 micro-batches) below BALANCED_BOUND: 1/17 by the formula,
1/2 if the two ranks took turns; the bound leaves room for a machine the ranks share with
other work (on 2 cores under a load of 8, 1F1B measured 0.17 where its formula gives 0.11).
The 2bw and pipedream schedules (no flush) print their own formula, (P-1)/(3M+P-1) = 1/13,
and --explain=json's bubble_formula is the same (both gave 1F1B's 1/5 before).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402

P, M, STEPS = 2, 4, 3
CHUNKS = 2
BALANCED_BOUND = 0.3


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


def interleaved_order(stage):
    total, order, f, b = CHUNKS * M, [], 0, 0
    warmup = min(total, (CHUNKS - 1) * P + 2 * (P - stage - 1))

    def name(kind, k):
        group = k // P
        chunk = group % CHUNKS if kind == "F" else CHUNKS - 1 - group % CHUNKS
        return "%s%d%s" % (kind, group // CHUNKS * P + k % P, "ab"[chunk])
    while f < warmup:
        order.append(name("F", f))
        f += 1
    while f < total:
        order += [name("F", f), name("B", b)]
        f += 1
        b += 1
    while b < total:
        order.append(name("B", b))
        b += 1
    return order


def bubble_line(kind, out):
    """(measured, formula) from the trainer's 'pipeline bubble' line, or None."""
    bubble = [line.split() for line in out.splitlines() if line.startswith("pipeline bubble")]
    if len(bubble) != 1:
        return None
    return float(bubble[0][2]), float(bubble[0][9])


def check(dmc, root, tmp, kind):
    trace = os.path.join(tmp, "t-%s.json" % kind)
    cmd = [dmc, "run", os.path.join(root, "examples/mlp.dm"), "--set", "B=16,H=64",
           "--mesh", "data=2,pipeline=2", "--microbatches", str(M), "--schedule", kind,
           "--data-dir", "/usr/share/datasets/fashion-mnist", "--steps", str(STEPS), "--quiet", "--trace", trace]
    chunks = CHUNKS if kind == "interleaved" else 1
    if kind == "interleaved":
        cmd += ["--chunks", str(CHUNKS)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return ["%s: `%s` exited %d:\n%s%s" % (kind, " ".join(cmd), out.returncode, out.stdout, out.stderr)]
    errors = []
    bubble = bubble_line(kind, out.stdout)
    if not bubble:
        errors.append("%s: no 'pipeline bubble' line in:\n%s" % (kind, out.stdout))
    else:
        measured, formula = bubble
        if abs(formula - (P - 1) / (chunks * M + P - 1)) > 1e-4 or not 0 <= measured < 1:
            errors.append("%s: bubble %g measured, formula %g" % (kind, measured, formula))
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
            want = interleaved_order(stage) if kind == "interleaved" else expected_order(kind, stage)
            if got != want:
                errors.append("%s: rank %d step %d ran %s, the schedule says %s" % (kind, r, step, got, want))
            for a, b in zip(actions, actions[1:]):
                if a["ts"] + a["dur"] > b["ts"] + 1e-3:
                    errors.append("%s: rank %d: %s and %s overlap" % (kind, r, a["name"], b["name"]))
    svg = os.path.splitext(trace)[0] + ".svg"
    try:
        ElementTree.parse(svg)
    except (OSError, ElementTree.ParseError) as e:
        errors.append("%s: %s: %s" % (kind, svg, e))
    return errors


def check_flushless(dmc, root, tmp, kind):
    """2bw and pipedream: the trainer's formula and --explain=json's are (P-1)/(3M+P-1)."""
    want = (P - 1) / (3 * M + P - 1)
    common = [os.path.join(root, "examples/mlp.dm"), "--set", "B=16,H=64", "--mesh", "pipeline=2",
              "--microbatches", str(M), "--schedule", kind]
    out = subprocess.run([dmc, "run"] + common + ["--data-dir", "/usr/share/datasets/fashion-mnist", "--steps",
                         str(STEPS), "--quiet", "--trace", os.path.join(tmp, "t-%s.json" % kind)],
                         capture_output=True, text=True, timeout=300)
    bubble = bubble_line(kind, out.stdout) if out.returncode == 0 else None
    errors = []
    if not bubble or abs(bubble[1] - want) > 1e-4 or "(P-1)/(3M+P-1)" not in out.stdout:
        errors.append("%s: the trace's formula is not (P-1)/(3M+P-1) = %.4f:\n%s%s" % (kind, want, out.stdout, out.stderr))
    ex = subprocess.run([dmc, "--explain=json"] + common, capture_output=True, text=True, timeout=120)
    formula = json.loads(ex.stdout)["pipeline"]["bubble_formula"] if ex.returncode == 0 else None
    if formula is None or abs(formula - want) > 1e-6:
        errors.append("%s: --explain=json's bubble_formula %s, want %.6f (%s)" % (kind, formula, want, ex.stderr.strip()))
    return errors


def check_balanced(dmc, root, tmp):
    """The measured bubble of interleaved 1F1B on 4 equal stages, against its bound."""
    trace = os.path.join(tmp, "t-balanced.json")
    rng = np.random.default_rng(0)
    batches = os.path.join(tmp, "stack.safetensors")
    steps = 6
    stio.save({"x": rng.standard_normal((steps, 128, 512)).astype(np.float32),
               "y": rng.integers(0, 8, (steps, 128)).astype(np.int32)}, batches)
    cmd = [dmc, "run", os.path.join(root, "tests/spmd/stack.dm"), "--set", "B=128,D=512,H=2048,K=8",
           "--mesh", "pipeline=2", "--microbatches", "8", "--schedule", "interleaved", "--chunks", str(CHUNKS),
           "--batch-file", batches, "--steps", str(steps), "--quiet", "--trace", trace]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    bubble = bubble_line("interleaved", out.stdout) if out.returncode == 0 else None
    if not bubble:
        return ["balanced: `%s` exited %d:\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr)]
    print("balanced interleaved: bubble %.4f measured, formula %.4f, bound %.2f" % (bubble[0], bubble[1], BALANCED_BOUND))
    if not bubble[0] < BALANCED_BOUND:
        return ["balanced: measured bubble %.4f, above %.2f (formula %.4f)" % (bubble[0], BALANCED_BOUND, bubble[1])]
    return []


def main():
    dmc, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        print("SKIP: dataset-fashion-mnist is not installed")
        return 77
    tmp = tempfile.mkdtemp(prefix="dmc-trace-")
    failures = 0
    try:
        for kind in ("gpipe", "1f1b", "interleaved"):
            errors = check(dmc, root, tmp, kind)
            for e in errors:
                print("FAIL %s" % e)
            failures += bool(errors)
            if not errors:
                print("%s: every rank ran its stage's order in each of %d steps" % (kind, STEPS))
        for kind in ("2bw", "pipedream"):
            errors = check_flushless(dmc, root, tmp, kind)
            for e in errors:
                print("FAIL %s" % e)
            failures += bool(errors)
            if not errors:
                print("%s: the trace's formula and --explain=json's are (P-1)/(3M+P-1)" % kind)
        errors = check_balanced(dmc, root, tmp)
        for e in errors:
            print("FAIL %s" % e)
        failures += bool(errors)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (6 - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
