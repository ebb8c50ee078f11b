#!/usr/bin/env python3
"""test_plan.py DMC: `dmc --plan` and `--mesh auto` against `dmc --explain`, plan by plan.

  - exhaustive comparison: for mlp.dm on 4 devices with a memory limit that some plans
    exceed, every plan --plan lists (--top 0, --plan-whole) is explained on its own with
    the options --plan prints for it; its step time and memory must be --explain's
    (predicted.step_seconds, memory_bytes_per_rank.peak_bytes_per_rank), `fits` must be
    memory <= limit, and --plan's first plan must be the fastest that fits by --explain;
    the search must try every data x tensor x pipeline factorization of 4;
  - the fast search of a deep model (small gpt, L=8, 8 and 12 devices: two-layer probes
    laid out eight times; pipeline=12 has stages without ops of their own) picks the same best plan as compiling every plan whole, and its step
    times are the whole compile's (1e-6) for plans without ZeRO 3;
  - --mesh auto explains the plan --plan ranks first; bad uses are refused with a message.
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples/mlp.dm")
GPT = os.path.join(ROOT, "examples/gpt.dm")
SMALL_GPT = ["--set", "V=512,T=32,C=64,NH=4,L=8"]
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


def run(dmc, args):
    r = subprocess.run([dmc] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return r.returncode, r.stdout, r.stderr


def key(p):
    return (p["mesh"]["data"], p["mesh"]["tensor"], p["mesh"]["pipeline"], p["microbatches"], p["schedule"],
            p["zero"], p["recompute"])


def exhaustive(dmc):
    args = ["--plan=json", "--top", "0", "--plan-whole", MLP, "--devices", "4", "--hardware", "cpu-2core"]
    rc, out, err = run(dmc, args)
    if rc == 0:
        # a limit between the smallest and the largest plan's memory
        memory = sorted(p["memory_bytes"] for p in json.loads(out)["plans"])
        # the limit as dmc reads it (the printed one: plans at the median sit on it)
        limit_gb = float("%.9f" % (memory[len(memory) // 2] / 2**30))
        rc, out, err = run(dmc, args + ["--memory-gb", "%.9f" % limit_gb])
    check(rc == 0, "mlp --plan=json on 4 devices runs (%s)" % err.strip()[:200])
    if rc:
        return
    plan = json.loads(out)
    meshes = {(p["mesh"]["data"], p["mesh"]["tensor"], p["mesh"]["pipeline"]) for p in plan["plans"]}
    want = {(d, t, 4 // d // t) for d in (1, 2, 4) for t in (1, 2, 4) if 4 % (d * t) == 0}
    check(meshes == want, "every factorization of 4 is searched: %s" % sorted(meshes))
    check(plan["searched"] == len(plan["plans"]), "--top 0 lists all %d plans" % plan["searched"])
    best_by_explain, mismatches = None, []
    for p in plan["plans"]:
        rc, out, err = run(dmc, ["--explain=json", MLP, "--hardware", "cpu-2core"] + p["options"].split())
        if rc:
            mismatches.append((key(p), err.strip()[:120]))
            continue
        e = json.loads(out)
        step = e["predicted"]["step_seconds"]
        memory = e["memory_bytes_per_rank"]["peak_bytes_per_rank"]
        if abs(step / p["step_seconds"] - 1) > 1e-6 or memory != p["memory_bytes"]:
            mismatches.append((key(p), step, p["step_seconds"], memory, p["memory_bytes"]))
        if p["fits"] != (memory <= limit_gb * 2**30):
            mismatches.append((key(p), "fits", p["fits"], memory))
        if memory <= limit_gb * 2**30 and (best_by_explain is None or step < best_by_explain[0] * (1 - 1e-9)):
            best_by_explain = (step, key(p))
    check(not mismatches, "each plan's step time and memory are --explain's (%d plans) %s" %
          (len(plan["plans"]), mismatches[:3]))
    check(0 < plan["fit"] < plan["searched"], "the limit leaves out some plans (%d of %d fit)" %
          (plan["fit"], plan["searched"]))
    first = plan["plans"][0]
    check(best_by_explain is not None and abs(first["step_seconds"] / best_by_explain[0] - 1) < 1e-9 and first["fits"],
          "the first plan is the fastest that fits by --explain: %s vs %s" % (key(first), best_by_explain))


def probes_match_whole(dmc, devices):
    base = ["--plan=json", GPT] + SMALL_GPT + ["--global-batch", "16", "--devices", str(devices), "--hardware",
                                               "cpu-2core", "--top", "0"]
    rc1, fast, err1 = run(dmc, base)
    rc2, whole, err2 = run(dmc, base + ["--plan-whole"])
    check(rc1 == 0 and rc2 == 0, "small gpt --plan on %d devices with probes and whole (%s %s)" % (devices, err1[:100], err2[:100]))
    if rc1 or rc2:
        return
    fast, whole = json.loads(fast), json.loads(whole)
    check(fast["method"] == "probe" and whole["method"] == "whole", "methods: %s, %s" % (fast["method"], whole["method"]))
    W = {key(p): p for p in whole["plans"]}
    check(set(W) == {key(p) for p in fast["plans"]}, "both searches try the same %d plans" % len(W))
    off = [(key(p), p["step_seconds"], W[key(p)]["step_seconds"]) for p in fast["plans"]
           if key(p) in W and p["zero"] < 3 and abs(p["step_seconds"] / W[key(p)]["step_seconds"] - 1) > 1e-6]
    check(not off, "probe step times are the whole compile's without ZeRO 3 (%s)" % off[:3])
    check(key(fast["plans"][0]) == key(whole["plans"][0]) and fast["plans"][0]["exact"],
          "the same best plan, compiled whole: %s and %s" % (key(fast["plans"][0]), key(whole["plans"][0])))


def mesh_auto(dmc):
    rc, out, err = run(dmc, ["--plan=json", MLP, "--devices", "2", "--hardware", "cpu-2core"])
    best = json.loads(out)["plans"][0] if rc == 0 else None
    rc, out, err = run(dmc, ["--explain=json", MLP, "--mesh", "auto", "--devices", "2", "--hardware", "cpu-2core"])
    check(rc == 0 and best is not None, "--explain --mesh auto runs (%s)" % err.strip()[:200])
    if rc == 0 and best:
        e = json.loads(out)
        check(abs(e["predicted"]["step_seconds"] / best["step_seconds"] - 1) < 1e-9 and "--mesh auto:" in err,
              "--mesh auto explains --plan's first plan (%s)" % best["options"])
    for args, words in [(["--plan", MLP], "--devices"),
                        (["--plan", MLP, "--devices", "2", "--zero", "1"], "chooses --zero"),
                        (["--explain", MLP, "--devices", "2"], "go with --plan"),
                        (["--plan", MLP, "--devices", "2", "--mesh", "auto"], "give one of them"),
                        (["--plan", MLP, "--devices", "2", "--global-batch", "64", "--set", "B=32"], "both set the batch")]:
        rc, out, err = run(dmc, args)
        check(rc != 0 and words in err, "%s is refused: %s" % (" ".join(args[2:]), err.strip()[:160]))


def main():
    dmc = sys.argv[1]
    exhaustive(dmc)
    probes_match_whole(dmc, 8)
    probes_match_whole(dmc, 12)   # pipeline=12 over 8 layers: stages of the estimate without a backward op
    mesh_auto(dmc)
    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
