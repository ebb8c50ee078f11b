"""test_stage_memory.py DMC SRCROOT: each pipeline stage holds its share, and no more.

For gpt.dm (tiny, L=4) on pipeline=2 and pipeline=4 (also interleaved: 2 chunks per rank,
the tied embedding's copy once per rank) and mlp.dm on pipeline=2, against the
serial plan of the same program (`dmc --explain=json`, memory_bytes_per_rank):
  - the stages' gradients and optimizer state add up to the serial program's exactly
    (each parameter's are held once, by the stage that updates it);
  - the stages' parameters add up to the serial program's plus one copy of each tied
    parameter per extra stage using it (gpt.dm's wte: the head on the last stage);
  - every stage's arena (one micro-batch's temporaries) is no larger than the serial
    program's for that micro-batch size, and the largest region figures are the stages'
    largest;
  - a stage holding k micro-batches at once allocates its arena plus k - 1 copies of the
    part the backward pass reads (activations_held = activations + (k - 1) *
    activations_kept), never more than k whole arenas; that part is no larger than what
    the pipeline's cut search counts for the stage (the forward results the backward
    reads and the values received: pipeline.stage[].activation_bytes + recv_bytes), so
    the search never under-counts it (beyond the layout's padding); and with data=2, a stage's working buffers (its
    arena less the kept part) are smaller than its gradients: each micro-batch's partial
    gradient is added to the step's sum as it is computed instead of living to the end.
Elements are rounded to 16 (64 bytes) per tensor, as the memory plan lays them out.
"""
import json
import os
import subprocess
import sys


def explain(dmc, dm, sets, *extra):
    r = subprocess.run([dmc, "--explain=json", dm, "--set", sets] + list(extra), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        raise SystemExit("FAIL: dmc --explain=json %s: %s" % (" ".join(extra), r.stderr))
    return json.loads(r.stdout)


def padded_bytes(elements):
    return (elements + 15) // 16 * 16 * 4


def held_failures(name, plan):
    """The held-arena formula and bounds of every stage; the failures printed and returned."""
    failures = []
    for k, (s, cut) in enumerate(zip(plan["memory_bytes_per_rank"]["stages"], plan["pipeline"]["stage"])):
        n, arena, kept, held = s["in_flight"], s["activations"], s["activations_kept"], s["activations_held"]
        searched = cut["activation_bytes"] + cut["recv_bytes"]
        checks = [("held", held == arena + (n - 1) * kept), ("in flight", n == cut["in_flight"]),
                  ("at most %d arenas" % n, held <= n * arena),
                  ("kept within the arena", 0 <= kept <= arena and (kept > 0) == (n > 1)),
                  # the layout pads each tensor to 64 bytes; the search counts elements
                  ("kept <= the cut search's %d B" % searched, kept == arena or kept <= 1.02 * searched + 256)]
        print("  stage %d: arena %d B, kept %d B x %d in flight, held %d B (cut search: %d B)"
              % (k, arena, kept, n, held, searched))
        for what, ok in checks:
            if not ok:
                print("FAIL %s: stage %d: %s" % (name, k, what))
                failures.append(k)
    return failures


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    gpt, mlp = os.path.join(root, "examples", "gpt.dm"), os.path.join(root, "examples", "mlp.dm")
    cases = [("gpt pipeline=2", gpt, "V=64,T=16,C=32,NH=4,L=4,B=8", ["--mesh", "pipeline=2", "--microbatches", "4"]),
             ("gpt pipeline=4 1f1b", gpt, "V=64,T=16,C=32,NH=4,L=4,B=8",
              ["--mesh", "pipeline=4", "--microbatches", "4", "--schedule", "1f1b"]),
             ("mlp pipeline=2", mlp, "B=16,D=48,H=64,K=10", ["--mesh", "pipeline=2", "--microbatches", "2"]),
             ("gpt pipeline=2 recompute", gpt, "V=64,T=16,C=32,NH=4,L=4,B=8",
              ["--mesh", "pipeline=2", "--microbatches", "4", "--recompute", "full"]),
             ("gpt pipeline=2 interleaved", gpt, "V=64,T=16,C=32,NH=4,L=4,B=8",
              ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"])]
    # (name, dm, sets, extra): stages' working buffers below their gradients
    summed = [("gpt data=2 pipeline=2", gpt, "V=64,T=16,C=32,NH=4,L=4,B=8",
               ["--mesh", "data=2,pipeline=2", "--microbatches", "4"])]
    failures = 0
    for name, dm, sets, extra in cases:
        micro = int(extra[extra.index("--microbatches") + 1])
        # the serial program at the micro-batch size: the same per-micro-batch arena scale
        b = [kv for kv in sets.split(",") if kv.startswith("B=")][0]
        serial_sets = sets.replace(b, "B=%d" % (int(b[2:]) // micro))
        serial = explain(dmc, dm, serial_sets)["memory_bytes_per_rank"]
        plan = explain(dmc, dm, sets, *extra)
        mem, stages = plan["memory_bytes_per_rank"], plan["memory_bytes_per_rank"]["stages"]
        params = {p["name"]: p["elements_per_rank"] for p in plan["params"]}
        ranks = plan["pipeline"]["ranks"]
        rank_of = [c["rank"] for c in plan["pipeline"]["stage"]]
        tied_extra = sum(padded_bytes(params[t["name"]]) * (len({rank_of[k] for k in t["stages"]}) - 1)
                         for t in plan["pipeline"]["tied"])
        by_rank = {what: [sum(s[what] for k, s in enumerate(stages) if rank_of[k] == r) for r in range(ranks)]
                   for what in ("params", "activations")}
        checks = [
            ("gradients", sum(s["grads"] for s in stages), serial["grads"]),
            ("optimizer state", sum(s["optimizer_state"] for s in stages), serial["optimizer_state"]),
            ("parameters", sum(s["params"] for s in stages), serial["params"] + tied_extra),
            ("largest parameters", mem["params"], max(by_rank["params"])),
            ("largest arena", mem["activations"], max(by_rank["activations"])),
        ]
        bad = [(what, got, want) for what, got, want in checks if got != want]
        big = [k for k, s in enumerate(stages) if s["activations"] > serial["activations"]]
        print("%-20s stages %d: params %s B (tied copies %d B), grads %s, state %s, arenas %s (serial %d)"
              % (name, len(stages), [s["params"] for s in stages], tied_extra, [s["grads"] for s in stages],
                 [s["optimizer_state"] for s in stages], [s["activations"] for s in stages], serial["activations"]))
        for what, got, want in bad:
            print("FAIL %s: %s: the stages hold %d bytes, expected %d" % (name, what, got, want))
        for k in big:
            print("FAIL %s: stage %d's arena (%d B) exceeds the serial program's (%d B)"
                  % (name, k, stages[k]["activations"], serial["activations"]))
        held = held_failures(name, plan)
        failures += bool(bad or big or held)
    for name, dm, sets, extra in summed:
        plan = explain(dmc, dm, sets, *extra)
        stages = plan["memory_bytes_per_rank"]["stages"]
        working = [s["activations"] - s["activations_kept"] for s in stages]
        print("%-20s working buffers %s B, gradients %s B" % (name, working, [s["grads"] for s in stages]))
        bad = [k for k, s in enumerate(stages) if working[k] >= s["grads"] or s["activations_kept"] == s["activations"]]
        for k in bad:
            print("FAIL %s: stage %d's working buffers (%d B, the arena less its kept part) hold its gradients (%d B)"
                  % (name, k, working[k], stages[k]["grads"]))
        bad += held_failures(name, plan)
        failures += bool(bad)
    cases += summed
    print("%d passed, %d failed" % (len(cases) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
