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
  - --mesh auto explains the plan --plan ranks first; bad uses are refused with a message;
  - the commands --plan prints (`run it:` and `or:`, with --mesh auto) run the plan it
    printed: each, through --explain, is accepted and predicts the plan's step and peak,
    on a mesh without a pipeline axis (only the program's axes in --mesh) and with the
    --set, --global-batch, --hardware and --memory-gb that shaped the plan; `--plan=json`'s
    run_options and options alike;
  - a program with `accumulate = 4` is planned for its whole batch (B, not B / 4), and
    --mesh auto --memory-gb never compiles a plan over the limit (a limit no plan fits is
    an error; one rank over --memory-gb is an error without stages too).
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

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


def explained(dmc, args):
    """--explain=json's predicted step (s) and peak per rank (B), or the error."""
    rc, out, err = run(dmc, ["--explain=json"] + args)
    if rc:
        return None, None, err.strip()[:200]
    e = json.loads(out)
    return e["predicted"]["step_seconds"], e["memory_bytes_per_rank"]["peak_bytes_per_rank"], ""


def printed_commands(dmc, args, what):
    """--plan's first plan and the commands it prints for it, each run through --explain:
    accepted, with the plan's step (the JSON's, and the text line's to its 3 decimals) and
    peak. Returns the JSON plan (None on failure)."""
    rc, out, err = run(dmc, ["--plan=json", "--top", "1"] + args)
    rc2, text, err2 = run(dmc, ["--plan"] + args)
    check(rc == 0 and rc2 == 0, "%s: --plan runs (%s)" % (what, (err + err2).strip()[:200]))
    if rc or rc2:
        return None
    plan = json.loads(out)
    best = plan["plans"][0]
    row = [l.split() for l in text.splitlines() if l.startswith("  1 ")]
    step_ms = float(row[0][8]) if row else None
    commands = [l.split(":", 1)[1].split(" (or ")[0] for l in text.splitlines()
                if l.startswith("run it:") or l.startswith("    or:")]
    check(len(commands) == 2, "%s: --plan prints `run it:` and `or:` (%d)" % (what, len(commands)))
    commands = list(zip(["run it", "or"], [shlex.split(c) for c in commands]))
    check("run_options" in plan and "auto_options" in plan, "%s: --plan=json has run_options and auto_options" % what)
    if "run_options" in plan and "auto_options" in plan:
        shaping = ["dmc", "run", args[0]] + shlex.split(plan["run_options"])
        commands += [("json options", shaping + best["options"].split()),
                     ("json auto_options", shaping + plan["auto_options"].split())]
    for how, words in commands:
        if words[:2] != ["dmc", "run"]:
            check(False, "%s: the %s command is dmc run: %s" % (what, how, " ".join(words)))
            continue
        step, peak, err = explained(dmc, words[2:])
        check(step is not None and abs(step / best["step_seconds"] - 1) < 1e-9 and peak == best["memory_bytes"]
              and step_ms is not None and abs(step * 1e3 - step_ms) < 6e-4,
              "%s: %s `%s` is accepted and predicts the plan's %.4f ms and %d B: %s ms, %s B %s" %
              (what, how, " ".join(words[2:]), best["step_seconds"] * 1e3, best["memory_bytes"],
               step and "%.4f" % (step * 1e3), peak, err))
    return best


def run_commands(dmc):
    # a mesh of data and tensor only: --mesh names no pipeline axis
    best = printed_commands(dmc, [os.path.join(ROOT, "tests/spmd/forms.dm"), "--set", "D=24,H=32,K=8",
                                  "--global-batch", "16", "--devices", "4", "--hardware", "cpu-2core"],
                            "forms.dm (data x tensor)")
    check(best is None or "pipeline" not in best["options"],
          "forms.dm: the options name only the program's axes (%s)" % (best and best["options"]))
    # --set, --global-batch, --hardware and --memory-gb shaped the plan: the commands carry them
    printed_commands(dmc, [GPT, "--set", "V=256,T=64,C=128,NH=4,L=4", "--global-batch", "16", "--devices", "2",
                           "--hardware", "cpu-2core", "--memory-gb", "0.01"], "small gpt")


def accumulated(dmc):
    with tempfile.TemporaryDirectory() as tmp:
        acc = os.path.join(tmp, "mlp_acc.dm")
        with open(acc, "w") as f:
            f.write(open(MLP).read() + "\naccumulate = 4\n")   # B = 128 in micro-batches of 32
        args = [acc, "--devices", "2", "--hardware", "cpu-2core"]
        rc, out, err = run(dmc, ["--plan=json", "--top", "0"] + args)
        check(rc == 0, "mlp.dm with accumulate = 4: --plan runs (%s)" % err.strip()[:200])
        if rc:
            return
        plan = json.loads(out)
        check(plan["global_batch"] == 128, "accumulate = 4: planned for the whole batch 128, not the micro-batch "
              "(global batch %d)" % plan["global_batch"])
        rc, text, err = run(dmc, ["--plan"] + args)
        check(rc == 0 and "global batch 128," in text, "accumulate = 4: --plan says global batch 128 (%s)" %
              text.splitlines()[0] if text else err)
        printed_commands(dmc, args + ["--memory-gb", "0.02"], "accumulate = 4")
        # --mesh auto under a limit: a plan that fits, or an error; never one over it
        memory = sorted(p["memory_bytes"] for p in plan["plans"])
        for limit in (0.0155 * 2**30, memory[len(memory) // 2], memory[0] / 2):
            gb = "%.9f" % (limit / 2**30)
            step, peak, err = explained(dmc, args[:1] + ["--mesh", "auto", "--memory-gb", gb] + args[1:])
            fits = [p for p in plan["plans"] if p["memory_bytes"] <= float(gb) * 2**30]
            check((peak is not None and peak <= float(gb) * 2**30 and fits) or (peak is None and not fits
                                                                               and "fits" in err),
                  "accumulate = 4: --mesh auto --memory-gb %s compiles a plan that fits or none (peak %s, %d of the "
                  "plans fit) %s" % (gb, peak, len(fits), err[:100]))
    # one stage, one rank over --memory-gb: an error, as a pipeline stage's is
    opts = ["--mesh", "data=1,tensor=2,pipeline=1", "--microbatches", "1", "--hardware", "cpu-2core"]
    step, peak, err = explained(dmc, [MLP] + opts)
    if peak:
        over = "%.9f" % (peak * 0.99 / 2**30)
        _, peak2, err2 = explained(dmc, [MLP] + opts + ["--memory-gb", over])
        check(peak2 is None and "over --memory-gb" in err2,
              "one stage allocating %d B is refused at --memory-gb %s: %s" % (peak, over, err2[:160]))
        enough = "%.9f" % (peak * 1.01 / 2**30)
        _, peak3, err3 = explained(dmc, [MLP] + opts + ["--memory-gb", enough])
        check(peak3 == peak, "and taken at --memory-gb %s (%s)" % (enough, err3[:160]))


def main():
    dmc = sys.argv[1]
    exhaustive(dmc)
    probes_match_whole(dmc, 8)
    probes_match_whole(dmc, 12)   # pipeline=12 over 8 layers: stages of the estimate without a backward op
    mesh_auto(dmc)
    run_commands(dmc)
    accumulated(dmc)
    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
