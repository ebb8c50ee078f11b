#!/usr/bin/env python3
"""test_comm_volume.py DMC: what `--explain=json` says each rank sends, against formulas.

For each case, every listed collective's sent_bytes_per_rank must be the ring
algorithm's figure for its op over its axis of n ranks, from the bytes of its operand
shard S (bytes_per_rank): allreduce 2 (n - 1) / n S, allgather (n - 1) S, reduce-scatter
and all-to-all (n - 1) / n S, a local shard_slice 0, and the split cross-entropy's
statistics (n - 1) S / 3 (the row maxima gathered) + 2 (n - 1) / n 2 S / 3 (two floats a
row summed). The communication summary must add them up by phase and axis, per step: a
forward or backward collective once per micro-batch (M = 4 sends 4 x what M = 1 does in
those phases, the same in the update). And,
independently of explain's operand figures: mlp.dm on data=4 sends 2 (3/4) x 4 bytes x
every parameter element in its update (one gradient allreduce per parameter), the
figure issue 14 measured for a ring (11.19 MB, where explain printed 7.46). And a LLaMA
on tensor=2, its RMSNorms written from ops, completes each norm's backward with one
allreduce of the residual's gradient (2 a layer, like GPT's layernorms), not three.
And a table split over its vocabulary rows gets its gradient made on its rows: the
LLaMA's embedding (its dy pending) by one allreduce of dy (B T C floats: 2 x 8 KiB sent
against the 32 KiB a reduce-scatter of the [V, C] gradient would send) and no
reduce-scatter; GPT's (its dy complete) with no collective at all. With pipeline stages
(gpt.dm on data=2 x pipeline=2; mlp.dm interleaved with ZeRO 3) each pipeline coordinate's
figure is the sum of its stages' collectives (by each one's stage), and they add to the total.
A pipeline's point-to-point traffic (communication.p2p_sent_bytes_by_pipeline_rank) against
the generated C (`dmc -o`): every dmrt_send and dmrt_send_tagged in stage k's forward and
backward functions, its floats x 4 bytes x the micro-batches (once a step in the update and
the step's function), summed on stage k's rank (k mod P), sends to its own rank left out
(gpt.dm with its tied embedding on data=2 x pipeline=2, on pipeline=3, interleaved and as
2bw; mlp.dm interleaved and as pipedream). The head's partial gradient of the tied
embedding goes once a step (GPipe, 1F1B, interleaved) or once a micro-batch (2bw).
Prints one line per case; exits 1 on any failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_LLAMA = "L=3,V=256,T=16,C=64,NH=4,F=128,B=2"
CASES = [
    ("examples/mlp.dm", ["--mesh", "data=4"]),
    ("examples/mlp.dm", ["--mesh", "data=2,tensor=2"]),
    ("examples/gpt.dm", ["--mesh", "data=2,tensor=2"]),
    ("examples/gpt.dm", ["--mesh", "tensor=4", "--set", "V=64,T=16,C=32,NH=4,L=2,B=4"]),
    ("tests/spmd/forms.dm", ["--mesh", "data=2,tensor=2"]),
    ("examples/mlp.dm", ["--mesh", "data=4", "--zero", "1"]),
    ("examples/mlp.dm", ["--mesh", "data=4", "--zero", "3", "--bucket-mb", "1"]),
    ("examples/llama.dm", ["--mesh", "tensor=2", "--set", SMALL_LLAMA]),
    # pipelines: a rank sends its own stages' collectives alone (interleaved: its chunks')
    ("examples/gpt.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--set", "V=64,T=16,C=32,NH=4,L=4,B=8"]),
    ("examples/mlp.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2",
                         "--zero", "3"]),
]


def ring(op, n, s):
    if op in ("shard_slice", "as_pending") or n <= 1:
        return 0.0
    if op == "allgather+allreduce":
        return s / 3 * (n - 1) + s * 2 / 3 * 2 * (n - 1) / n
    if op == "allreduce":
        return s * 2 * (n - 1) / n
    if op == "allgather":
        return s * (n - 1)
    return s * (n - 1) / n


def check(dmc, dm, args):
    r = subprocess.run([dmc, "--explain=json", os.path.join(ROOT, dm)] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        return ["explain failed: " + r.stderr]
    plan = json.loads(r.stdout)
    sizes = {a["axis"]: a["size"] for a in plan["mesh"]}
    fails, by = [], {}
    # ZeRO's reduce-scatters and all-gathers stand in for the allreduces they replace
    made = [c for c in plan["collectives"] if not c.get("replaced_by_zero")]
    made += plan.get("zero", {}).get("collectives", [])
    for c in made:
        want = ring(c["op"], sizes[c["axis"]], c["bytes_per_rank"])
        if abs(c["sent_bytes_per_rank"] - want) > 1:
            fails.append("%s %s of %s: sent %s, ring formula %.0f" % (c["phase"], c["op"], c["value"],
                                                                     c["sent_bytes_per_rank"], want))
        key = (c["phase"], c["axis"])
        # a forward or backward collective runs once per micro-batch; the summary is the step's
        times = 1 if c["phase"] == "update" else plan["communication"]["microbatches"]
        by[key] = by.get(key, 0) + times * c["sent_bytes_per_rank"]
    comm = plan["communication"]
    got = {(e["phase"], e["axis"]): e["sent_bytes_per_rank"] for e in comm["by_phase_axis"]}
    for key in set(by) | set(got):
        if by.get(key, 0) > 0.5 and abs(got.get(key, 0) - by.get(key, 0)) > 1 + 1e-9 * by[key]:
            fails.append("%s over %s: summary %s, collectives add to %.0f" % (key[0], key[1], got.get(key), by[key]))
    if abs(comm["sent_bytes_per_rank"] - sum(by.values())) > len(by) + 1:
        fails.append("total %s, collectives add to %.0f" % (comm["sent_bytes_per_rank"], sum(by.values())))
    if "--zero" in args and args[args.index("--zero") + 1] == "3":
        # ZeRO 3: besides the reduce-scatter of every bucket in the update, (n - 1)/n of every
        # element the forward and backward passes gather, once per micro-batch
        n, zero, M = sizes["data"], plan["zero"], comm["microbatches"]
        want_update = sum(4 * b["elements"] * (n - 1) / n for b in zero["buckets"])
        want_early = M * 4 * zero["gathered_elements"] * (n - 1) / n
        early = got.get(("forward", "data"), 0) + got.get(("backward", "data"), 0) - M * by_loss(plan)
        if abs(got.get(("update", "data"), 0) - want_update) > 1 or abs(early - want_early) > 8:
            fails.append("zero 3: update %s (buckets' formula %.0f), gathers %.0f (formula %.0f)" %
                         (got.get(("update", "data")), want_update, early, want_early))
    if dm == "examples/mlp.dm" and args[:2] == ["--mesh", "data=4"] and "--bucket-mb" not in args:
        # ZeRO 1: a reduce-scatter and an all-gather of each bucket, the allreduce's bytes
        # over the buckets' elements (each rounded up to a multiple of n)
        params = sum(p["elements"] for p in plan["params"])
        if "zero" in plan:
            params = sum(b["elements"] for b in plan["zero"]["buckets"])
        want = 2 * 3 / 4 * 4 * params
        if abs(got.get(("update", "data"), 0) - want) > 1:
            fails.append("mlp data=4 update: sent %s, 1.5 x 4 bytes x %d parameters = %.0f" %
                         (got.get(("update", "data")), params, want))
    if "pipeline" in plan and plan["pipeline"]["ranks"] > 1:
        fails += by_pipeline_rank(plan, made)
    if dm == "examples/llama.dm":
        fails += norm_allreduces(plan, 3, 2 * 16 * 64 * 4)
        fails += embedding_rows(plan, "model.embed_tokens", 2 * 16 * 64 * 4)
    if dm == "examples/gpt.dm":
        fails += embedding_rows(plan, "wte", 0)
    print("%-22s %-50s %3d collectives, %.0f bytes sent per rank%s" % (
        dm, " ".join(args), len(plan["collectives"]), comm["sent_bytes_per_rank"], " FAIL" if fails else ""))
    return fails


def by_pipeline_rank(plan, made):
    """A rank at pipeline coordinate r runs the collectives of its stages (stage % ranks = r)
    alone: communication.sent_bytes_by_pipeline_rank[r] is their sum per step, and the
    coordinates' figures add up to the summary's total (which counts every stage's)."""
    P, comm = plan["pipeline"]["ranks"], plan["communication"]
    want = [0.0] * P
    for c in made:
        times = 1 if c["phase"] == "update" else comm["microbatches"]
        want[c["stage"] % P] += times * c["sent_bytes_per_rank"]
    got = comm.get("sent_bytes_by_pipeline_rank")
    if not got or len(got) != P or any(abs(g - w) > 1 + 1e-9 * w for g, w in zip(got, want)):
        return ["by pipeline rank: %s, the stages' collectives add to %s" % (got, want)]
    if sum(want) == 0 or min(want) == max(want):
        return ["by pipeline rank: %s, which would not tell the coordinates apart" % want]
    if abs(sum(got) - comm["sent_bytes_per_rank"]) > P + 1e-9 * sum(got):
        return ["by pipeline rank: %s, summing to %.0f, not the total %s" % (got, sum(got), comm["sent_bytes_per_rank"])]
    return []


def norm_allreduces(plan, layers, activation_bytes):
    """RMSNorm written from ops on tensor=2: the residual's gradient gathers three pending
    terms from each norm (issue 38); they must be summed by one allreduce per norm, as
    GPT's layernorm has: 2 per layer, none of them an as_pending's (which moves nothing)."""
    backward = [c for c in plan["collectives"] if c["phase"] == "backward" and c["axis"] == "tensor"
                and c["op"] == "allreduce" and c["bytes_per_rank"] == activation_bytes
                and not c["value"].startswith("d_model.embed_tokens")]
    joins = [c for c in plan["collectives"] if c["op"] == "as_pending"]
    fails = []
    if len(backward) != 2 * layers:
        fails.append("%d activation allreduces in the backward, want 2 per layer = %d: %s" %
                     (len(backward), 2 * layers, [c["value"] for c in backward]))
    if not joins or any(c["sent_bytes_per_rank"] != 0 or c["reason"] != "whole operands join the pending sum they are added to"
                        for c in joins):
        fails.append("as_pending rows: %s" % joins)
    return fails


def embedding_rows(plan, table, dy_bytes):
    """The vocabulary-split table's gradient made on its rows: no reduce-scatter or slice of
    it in the backward; dy_bytes > 0: one allreduce of the embedding's dy, of that size, made
    for that reason; 0: none (dy was complete)."""
    backward = [c for c in plan["collectives"] if c["phase"] == "backward" and c["axis"] == "tensor"]
    of_table = [c for c in backward if c["value"].startswith(table + ".weight.grad") or c["value"] == "d_" + table + ".weight"]
    of_dy = [c for c in backward if c["value"] == "d_" + table]
    fails = []
    if of_table:
        fails.append("%s's gradient is moved in the backward: %s" % (table, of_table))
    want = [("allreduce", dy_bytes)] if dy_bytes else []
    if [(c["op"], c["bytes_per_rank"]) for c in of_dy] != want or \
            any("vocabulary rows' gradient" not in c["reason"] for c in of_dy):
        fails.append("%s's dy: %s, want %s" % (table, of_dy, want))
    return fails


def by_loss(plan):
    """What the forward's loss allreduce sends (it is not ZeRO's)."""
    return sum(c["sent_bytes_per_rank"] for c in plan["collectives"] if c["value"] == "loss.local")


def summary(dmc, dm, args):
    r = subprocess.run([dmc, "--explain=json", os.path.join(ROOT, dm)] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        return None
    comm = json.loads(r.stdout)["communication"]
    return comm, {(e["phase"], e["axis"]): e["sent_bytes_per_rank"] for e in comm["by_phase_axis"]}


def check_microbatches(dmc):
    """The summary is per step: with M micro-batches of b samples, the forward's and backward's
    collectives (tensor's allreduces, data's loss mean, ZeRO 3's gathers) send M times what one
    step of one micro-batch of b sends, the update's what it sends (the formula: M x the bytes
    for M = 1). mlp.dm, micro-batches of 32, M = 4 against M = 1."""
    fails = []
    for dm, mesh in (("examples/mlp.dm", "data=2,tensor=2"), ("examples/mlp.dm", "data=4"),
                     ("examples/gpt.dm", "tensor=2,pipeline=2")):
        extra = ["--zero", "3"] if mesh == "data=4" else []
        dims = "V=64,T=16,C=32,NH=4,L=2," if dm.endswith("gpt.dm") else ""
        one = summary(dmc, dm, ["--mesh", mesh, "--set", dims + "B=32"] + extra)
        four = summary(dmc, dm, ["--mesh", mesh, "--set", dims + "B=128", "--microbatches", "4"] + extra)
        if not one or not four:
            fails.append("%s %s: explain failed" % (dm, mesh))
            continue
        want = {k: (v if k[0] == "update" else 4 * v) for k, v in one[1].items()}
        ok = four[0]["microbatches"] == 4 and set(want) == set(four[1]) and \
            all(abs(four[1][k] - want[k]) <= 1e-9 * want[k] + 4 for k in want)
        print("%-22s %-50s M=4 sends %s, formula (M x M=1's forward and backward) %s%s" % (
            dm, mesh + " " + " ".join(extra), sorted(four[1].items()), sorted(want.items()), "" if ok else " FAIL"))
        if not ok:
            fails.append("%s %s M=4: %s, want %s" % (dm, mesh, four[1], want))
    return fails


P2P_CASES = [
    ("examples/gpt.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--set", "V=64,T=16,C=32,NH=4,L=4,B=8"]),
    ("examples/gpt.dm", ["--mesh", "pipeline=3", "--microbatches", "3", "--schedule", "1f1b",
                         "--set", "V=64,T=16,C=32,NH=4,L=6,B=6"]),
    ("examples/gpt.dm", ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2",
                         "--set", "V=64,T=16,C=32,NH=4,L=4,B=8"]),
    ("examples/gpt.dm", ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw",
                         "--set", "V=64,T=16,C=32,NH=4,L=4,B=8"]),
    ("examples/mlp.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"]),
    ("examples/mlp.dm", ["--mesh", "pipeline=3", "--microbatches", "4", "--schedule", "pipedream"]),
]
# gpt.dm's tied head: the V x C floats of the head's partial gradient of wte.weight
TIED_PARTIAL_FLOATS = 64 * 32


def tied_partial_sends(code):
    """The sends of the head's partial gradient (V x C floats) in the backward functions
    (once a micro-batch) and in the step's (once a step)."""
    per = {"micro": 0, "step": 0}
    for m in re.finditer(r"^static int (?:stage|rank)\d+_(backward|train)\(.*?^}", code, re.M | re.S):
        for call in SEND_RE.finditer(m.group(0)):
            if int(call.group(3)) == TIED_PARTIAL_FLOATS:
                per["micro" if m.group(1) == "backward" else "step"] += 1
    return per
SEND_RE = re.compile(r"dmrt_send(_tagged)?\(ctx->comm\[\d+\], (\d+), (?:\d+, )?[^,]+, (\d+), \"")


def p2p_of_code(code, ranks, micro):
    """What each pipeline rank's dmrt_send calls move in a step, from the generated C: a
    stage's forward and backward functions run once a micro-batch; its update, its step
    (stageK_train) and, interleaved, its rank's (rankR_train, rankR_update) once a step."""
    sent = [0] * ranks
    for m in re.finditer(r"^static int (stage|rank)(\d+)_(forward|backward|update|train)\(.*?^}", code, re.M | re.S):
        rank, phase = int(m.group(2)) % ranks, m.group(3)
        for call in SEND_RE.finditer(m.group(0)):
            peer, floats = int(call.group(2)), int(call.group(3))
            if peer != rank:
                sent[rank] += 4 * floats * (micro if phase in ("forward", "backward") else 1)
    return sent


def check_p2p(dmc):
    fails = []
    for dm, args in P2P_CASES:
        plan = json.loads(subprocess.run([dmc, "--explain=json", os.path.join(ROOT, dm)] + args, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, universal_newlines=True, check=True).stdout)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([dmc, os.path.join(ROOT, dm), "-o", tmp] + args, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            name = os.path.basename(dm)[:-3]
            code = open(os.path.join(tmp, name + ".c")).read()
        want = p2p_of_code(code, plan["pipeline"]["ranks"], plan["pipeline"]["microbatches"])
        got = plan["communication"].get("p2p_sent_bytes_by_pipeline_rank")
        ok = got == want and sum(want) > 0
        print("%-18s %-60s point to point by pipeline rank %s, the generated sends %s%s" % (
            dm, " ".join(args), got, want, "" if ok else " FAIL"))
        if not ok:
            fails.append("%s %s: p2p %s, the generated code's sends %s" % (dm, " ".join(args), got, want))
        if "gpt" in dm:
            # the head's partial gradient of the tied embedding: summed over the micro-batches
            # and sent once a step where one update follows them; 2bw sends each micro-batch's
            tied = tied_partial_sends(code)
            expect = {"micro": 1, "step": 0} if "2bw" in args else {"micro": 0, "step": 1}
            print("%-18s %-60s the tied head's partial gradient: %s sends (want %s)%s" % (
                dm, " ".join(args), tied, expect, "" if tied == expect else " FAIL"))
            if tied != expect:
                fails.append("%s %s: the tied partial's sends %s, want %s" % (dm, " ".join(args), tied, expect))
    return fails


def main(argv):
    failures = []
    for dm, args in CASES:
        failures += ["%s %s: %s" % (dm, " ".join(args), f) for f in check(argv[1], dm, args)]
    failures += ["micro-batches: %s" % f for f in check_microbatches(argv[1])]
    failures += ["point to point: %s" % f for f in check_p2p(argv[1])]
    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed" % (len(CASES) - len({f.split(":")[0] for f in failures}), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
