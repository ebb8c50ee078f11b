"""test_memory.py DMC SRCROOT: what --explain predicts each rank allocates, it allocates.

For mlp.dm and the tiny gpt.dm on the serial program, data=2, tensor=2, accumulation,
pipeline=2 (GPipe, 1F1B and interleaved 1F1B with 2 chunks, 4 micro-batches) and
data=2 x tensor=2 x pipeline=2 (also interleaved), ZeRO (also interleaved), --precision bf16, and 2bw and
pipedream on pipeline=2 and pipedream on pipeline=4 (these to the byte), the
peak of each rank's model allocations (`dmc run --memory`: the generated context counts
every buffer it allocates, dmrt_alloc_tracked) must be within 5% of `dmc
--explain=json`'s memory.peak_bytes_by_stage for that rank's pipeline stage (the issue's
bound; the plan and the code agree to the byte today). A rank's stage is its coordinate
on the pipeline axis (ranks are row-major over the mesh, the last axis fastest); with
interleaved chunks the entry of that coordinate holds all its stages.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402

BOUND = 0.05
MODELS = {"mlp": ("examples/mlp.dm", "B=16,D=48,H=64,K=10"), "gpt": ("examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=4,B=8")}
MESHES = [[], ["--mesh", "data=2"], ["--mesh", "tensor=2"], ["--accumulate", "2"],
          ["--mesh", "pipeline=2", "--microbatches", "4"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"],
          ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"],
          ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"],
          ["--mesh", "data=2", "--zero", "1"], ["--mesh", "data=4", "--zero", "2"],
          ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4", "--zero", "2"],
          ["--mesh", "data=2", "--zero", "3"],
          # ZeRO's shares of each chunk's buckets stacked in their rank's regions
          ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2", "--zero", "2"],
          ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2", "--zero", "3"],
          ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4", "--schedule", "1f1b", "--zero", "3"],
          # bf16 products: the casts' 2-byte buffers counted exactly
          ["--precision", "bf16"],
          ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "4", "--schedule", "1f1b", "--zero", "3",
           "--precision", "bf16"],
          # the schedules that keep weight versions: every stage's versions, its empty buffers
          # (pipedream's weights[k] on stage s >= P - k, 64 bytes each) and the previous inputs
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "pipedream"],
          ["--mesh", "pipeline=4", "--microbatches", "8", "--schedule", "pipedream"]]
# to the byte on these: 5% hid pipedream's stage s allocating 64 s bytes more than predicted
EXACT = ("2bw", "pipedream")
# ZeRO against its formula: the optimizer state (and, for zero 2, the gradients; for zero 3
# the parameters too) per rank is the unsharded plan's over the data axis's size k, within
# the rounding of each bucket's share (16 elements per state tensor and bucket) and the
# parameters' padding to a multiple of k and 16
ZERO_FORMULA = [("data=2", "1"), ("data=4", "2"), ("data=4", "1"), ("data=4", "3")]


def batch(model, sets):
    dims = {k: int(v) for k, v in (kv.split("=") for kv in sets.split(","))}
    rng = np.random.default_rng(0)
    if model == "mlp":
        return {"x": rng.standard_normal((1, dims["B"], dims["D"])).astype(np.float32),
                "y": rng.integers(0, dims["K"], (1, dims["B"])).astype(np.int32)}
    shape = (1, dims["B"], dims["T"])
    return {"tokens": rng.integers(0, dims["V"], shape).astype(np.int32),
            "targets": rng.integers(0, dims["V"], shape).astype(np.int32)}


def stage_of(rank, mesh):
    """The pipeline coordinate of a rank (0 without a pipeline axis)."""
    sizes = [a["size"] for a in mesh]
    names = [a["axis"] for a in mesh]
    if "pipeline" not in names:
        return 0
    k = names.index("pipeline")
    inner = 1
    for s in sizes[k + 1:]:
        inner *= s
    return rank // inner % sizes[k]


def explain_json(dmc, dm, sets, extra):
    r = subprocess.run([dmc, "--explain=json", dm, "--set", sets] + extra, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, check=True)
    return json.loads(r.stdout)


def zero_formula(dmc, dm, sets, model):
    """The ZeRO plans' state and gradients per rank against the unsharded plan's / k."""
    failures = []
    for mesh, stage in ZERO_FORMULA:
        k = int(mesh.split("=")[1])
        base = explain_json(dmc, dm, sets, ["--mesh", mesh])
        plan = explain_json(dmc, dm, sets, ["--mesh", mesh, "--zero", stage])
        buckets = len(plan["zero"]["buckets"])
        mem, mem0 = plan["memory_bytes_per_rank"], base["memory_bytes_per_rank"]
        states = 2  # AdamW: exp_avg, exp_avg_sq
        slack = 4 * (states * 16 * buckets + 16 * k * len(plan["params"]))
        parts = [("optimizer_state", mem0["optimizer_state"] / k)]
        parts.append(("grads", mem0["grads"] / k if stage >= "2" else mem0["grads"]))
        parts.append(("params", mem0["params"] / k if stage == "3" else mem0["params"]))
        for part, want in parts:
            got = mem[part]
            ok = abs(got - want) <= slack
            print("%-48s %s: %d bytes per rank, formula %d (slack %d)%s"
                  % ("%s %s --zero %s" % (model, mesh, stage), part, got, want, slack, "" if ok else "  FAIL"))
            if not ok:
                failures.append("%s %s --zero %s: %s %d bytes, formula %d" % (model, mesh, stage, part, got, want))
    return failures


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    failures, checks = [], 0
    with tempfile.TemporaryDirectory(prefix="dmc-memory-") as tmp:
        for model, (dm, sets) in MODELS.items():
            dm = os.path.join(root, dm)
            bf = os.path.join(tmp, model + ".safetensors")
            stio.save(batch(model, sets), bf)
            for extra in MESHES:
                what = "%s %s" % (model, " ".join(extra) or "serial")
                r = subprocess.run([dmc, "--explain=json", dm, "--set", sets] + extra, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, universal_newlines=True)
                if r.returncode != 0:
                    failures.append("%s: explain failed: %s" % (what, r.stderr))
                    continue
                plan = json.loads(r.stdout)
                predicted = plan["memory_bytes_per_rank"]["peak_bytes_by_stage"]
                r = subprocess.run([dmc, "run", dm, "--set", sets, "--batch-file", bf, "--steps", "1", "--quiet",
                                    "--memory"] + extra, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   universal_newlines=True, env=dict(os.environ, TMPDIR=tmp), timeout=600)
                measured = {int(a): int(b) for a, b in re.findall(r"^memory rank (\d+): model peak (\d+) bytes", r.stderr, re.M)}
                ranks = plan.get("ranks", 1)
                if r.returncode != 0 or len(measured) != ranks:
                    failures.append("%s: `dmc run --memory` exited %d with %d of %d ranks' lines:\n%s"
                                    % (what, r.returncode, len(measured), ranks, r.stderr[-2000:]))
                    continue
                worst = 0.0
                for rank, got in sorted(measured.items()):
                    want = predicted[stage_of(rank, plan.get("mesh", []))]["total"]
                    err = abs(got - want) / want
                    worst = max(worst, err)
                    checks += 1
                    exact = any(s in extra for s in EXACT)
                    if err > BOUND or (exact and got != want):
                        failures.append("%s rank %d: allocated %d bytes, --explain predicts %d (%.1f%%)"
                                        % (what, rank, got, want, 100 * err))
                print("%-48s %d rank(s): measured %s bytes, predicted %s; worst difference %.2f%%"
                      % (what, ranks, sorted(set(measured.values())), sorted(set(p["total"] for p in predicted)),
                         100 * worst))
            failures += zero_formula(dmc, dm, sets, model)
    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed" % (checks, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
