#!/usr/bin/env python3
"""test_attention_memory.py DMC: the memory fused attention saves, against a formula.

Unfused, each of gpt.dm's L attention layers keeps its probabilities softmax(q @ kT / c),
P = B x NH x T x T floats of one rank's shards (B and NH divided by the data and tensor
axes), for the backward; the fused kernel keeps each row's log-sum-exp, B x NH x T
floats, and makes the scores again. So the activation arena must drop by about L x P:

  (L - 1) x P <= unfused arena - fused arena <= (L + 2) x P

The lower bound: the L probabilities are gone, less at most one layer's worth of other
buffers that the fused plan's peak may hold where the unfused plan's did not; the upper:
beyond them, the unfused plan holds at most two more T x T buffers of one layer at once
(its scores and probabilities forward, their gradients backward). And exactly:
--explain=json's fused_attention counts L attentions, L x P bytes of probabilities the
unfused ops keep and L x B x NH x T x 4 of statistics kept instead; the unfused plan has
no fused attention.

Exactly, where a plan lays out apart what the forward keeps for the backward (a pipeline
with several micro-batches in flight: each stage's kept part, and the cut search's count
of the forward's values the backward reads), summed over the stages: per layer the
probabilities go and the statistics come. The fused backward reads the attention's
output, which on the C target is also the heads merged back ([B, T, NH, D]: the heads'
transposes are folded into the attention, passes/fuse_attention.c), which the output
projection's weight gradient reads and both plans keep; the unfused backward reads the
probabilities, v and q, k, which both keep too. So

  unfused kept - fused kept = L x 4 x (B / M) x NH x T x (T - 1) bytes

for M micro-batches. And stage by stage on GPT-2 124M, B=8 on pipeline=4: the stage
table's activations (a stage's own kept values and what it receives) are the memory
plan's kept part. (With the transposes kept around the attention, as on the CUDA
target, the fused plan keeps the output besides the merged copy: T - D - 1, for head size
D.)

Grouped-query attention (examples/llama.dm, NKV key/value heads for NH query heads, head
size HD): unfused, repeat_kv's copies of k and v, [B, NH, T, HD] each, are what the
products' backward reads; fused, the attention reads and keeps k and v at NKV heads (the
repeats are folded in). llama.dm has no heads_inner (RoPE sits between the heads' split
and the attention), so the fused plan keeps the output besides its merged copy. The cut
search's count of what the forward keeps for the backward:

  unfused kept - fused kept = L x 4 x (B / M) x (NH x T x (T - 1 - HD) + 2 (NH - NKV) x T x HD)

and the memory plan's kept part drops by exactly 4 x L x (B / M) x 2 (NH - NKV) x T x HD
bytes more at NKV than at NKV = NH (its other terms do not depend on NKV). Fused, the
memory plan keeps exactly what the cut search counts (RoPE's cos and sin tables, made once
when the context is created, in neither).

Measured: one training step of a small GPT each way (`dmc run --memory`, text from this
repository's README) must peak at exactly what --explain predicts, so the drop is real.
Prints one line per case; exits 1 on any failure.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT = os.path.join(ROOT, "examples", "gpt.dm")
MIB = 1024.0 * 1024.0
# (--set, --mesh): the bench's mid GPT serial and on data x tensor, a sequence that is not
# a multiple of the kernel's 64-position tile, a longer one
CASES = [
    ("V=256,T=256,C=256,NH=8,L=4,B=8", None),
    ("V=256,T=256,C=256,NH=8,L=4,B=8", "data=2,tensor=2"),
    ("V=64,T=100,C=32,NH=4,L=3,B=2", None),
    ("V=256,T=512,C=128,NH=4,L=6,B=2", None),
]
MEASURED = "V=256,T=128,C=64,NH=4,L=2,B=4"
KEPT = ("V=256,T=256,C=256,NH=8,L=4,B=8", ["--mesh", "pipeline=2", "--microbatches", "4"], 4)
LLAMA = os.path.join(ROOT, "examples", "llama.dm")
GQA = ("V=256,T=128,C=128,NH=8,NKV=%d,F=256,L=2,B=8", ["--mesh", "pipeline=2", "--microbatches", "4"], 4, (8, 2, 1))


def dims_of(sets, mesh):
    d = {k: int(v) for k, v in (kv.split("=") for kv in sets.split(","))}
    axes = {k: int(v) for k, v in (kv.split("=") for kv in mesh.split(","))} if mesh else {}
    d["B"] //= axes.get("data", 1)
    d["NH"] //= axes.get("tensor", 1)
    return d


def explain(dmc, sets, mesh, fused, extra=(), model=GPT):
    args = [dmc, "--explain=json", model, "--set", sets] + (["--mesh", mesh] if mesh else []) + list(extra)
    args += [] if fused else ["--no-fuse-attention"]
    return json.loads(subprocess.run(args, stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout)


def check_plan(dmc, sets, mesh):
    d = dims_of(sets, mesh)
    L, P = d["L"], 4 * d["B"] * d["NH"] * d["T"] * d["T"]
    f, u = explain(dmc, sets, mesh, True), explain(dmc, sets, mesh, False)
    fails = []
    want = {"count": L, "kept_bytes": L * d["B"] * d["NH"] * d["T"] * 4, "unfused_probability_bytes": L * P,
            "grouped": 0, "unrepeated_bytes": 0}
    if f["fused_attention"] != want:
        fails.append("fused_attention %s, expected %s" % (f["fused_attention"], want))
    if u["fused_attention"]["count"] != 0:
        fails.append("--no-fuse-attention still fuses %d" % u["fused_attention"]["count"])
    drop = u["memory_bytes_per_rank"]["activations"] - f["memory_bytes_per_rank"]["activations"]
    print("%-34s %-16s arena %8.2f -> %8.2f MiB: drop %7.2f MiB = %.2f x L x P (L x P = %.2f MiB; bounds %.2f .. %.2f)"
          % (sets, mesh or "one device", u["memory_bytes_per_rank"]["activations"] / MIB,
             f["memory_bytes_per_rank"]["activations"] / MIB, drop / MIB, drop / (L * P), L * P / MIB,
             (L - 1) / L, (L + 2) / L))
    if not (L - 1) * P <= drop <= (L + 2) * P:
        fails.append("arena drop %d bytes outside [(L - 1) P, (L + 2) P] = [%d, %d]" % (drop, (L - 1) * P, (L + 2) * P))
    return ["%s %s: %s" % (sets, mesh or "", x) for x in fails]


def check_kept(dmc):
    sets, extra, micro = KEPT
    d = dims_of(sets, None)
    want = d["L"] * 4 * (d["B"] // micro) * d["NH"] * d["T"] * (d["T"] - 1)
    fails, kept = [], {}
    for fused in (True, False):
        plan = explain(dmc, sets, None, fused, extra)
        kept[fused] = (sum(s["activations_kept"] for s in plan["memory_bytes_per_rank"]["stages"]),
                       sum(s["activation_bytes"] for s in plan["pipeline"]["stage"]),
                       [(s["first"], s["last"]) for s in plan["pipeline"]["stage"]])
    if kept[True][2] != kept[False][2]:
        return ["%s: the stages differ fused %s and unfused %s" % (sets, kept[True][2], kept[False][2])]
    for k, what in ((0, "memory plan's kept part"), (1, "cut search's activations")):
        drop = kept[False][k] - kept[True][k]
        print("%-34s %-16s %s: %d -> %d bytes, drop %d (formula %d)" % (sets, " ".join(extra[1:2]), what,
                                                                        kept[False][k], kept[True][k], drop, want))
        if drop != want:
            fails.append("%s %s: drop %d bytes, formula %d" % (sets, what, drop, want))
    return fails


def kept_drops(dmc, model, sets, extra):
    """(memory plan's kept part, cut search's activations) unfused minus fused, and the fused
    plan's fused_attention; fused, the
    two must be equal (RoPE's tables, made once at create, are in neither)."""
    kept = {}
    for fused in (True, False):
        plan = explain(dmc, sets, None, fused, extra, model)
        if fused:
            attention = plan["fused_attention"]
        # the cut search's count: what each stage makes and keeps, and what it receives
        # (a stage's last output is the receiver's, as the memory plan keeps it)
        kept[fused] = (sum(s["activations_kept"] for s in plan["memory_bytes_per_rank"]["stages"]),
                       sum(s["activation_bytes"] + s["recv_bytes"] for s in plan["pipeline"]["stage"]),
                       [(s["first"], s["last"]) for s in plan["pipeline"]["stage"]])
    if kept[True][2] != kept[False][2]:
        raise RuntimeError("%s: the stages differ fused %s and unfused %s" % (sets, kept[True][2], kept[False][2]))
    if kept[True][0] != kept[True][1]:
        raise RuntimeError("%s: fused, the memory plan keeps %d bytes for the backward, the cut search counts %d"
                           % (sets, kept[True][0], kept[True][1]))
    return kept[False][0] - kept[True][0], kept[False][1] - kept[True][1], attention


def check_kept_grouped(dmc):
    template, extra, micro, kv_heads = GQA
    fails, plan_drop = [], {}
    for nkv in kv_heads:
        sets = template % nkv
        d = dims_of(sets, None)
        L, T, NH, HD, B = d["L"], d["T"], d["NH"], d["C"] // d["NH"], d["B"] // micro
        try:
            plan_drop[nkv], search_drop, attention = kept_drops(dmc, LLAMA, sets, extra)
        except RuntimeError as e:
            return [str(e)]
        grouped = L if nkv < NH else 0
        unrepeated = grouped * 2 * 4 * B * NH * T * HD
        if (attention["grouped"], attention["unrepeated_bytes"]) != (grouped, unrepeated):
            fails.append("%s: --explain's grouped %d, unrepeated_bytes %d; expected %d, %d"
                         % (sets, attention["grouped"], attention["unrepeated_bytes"], grouped, unrepeated))
        want = L * 4 * B * (NH * T * (T - 1 - HD) + 2 * (NH - nkv) * T * HD)
        print("%-38s llama cut search's activations: drop %d (formula %d)" % (sets, search_drop, want))
        if search_drop != want:
            fails.append("%s: cut search's drop %d bytes, formula %d" % (sets, search_drop, want))
        repeats = L * 4 * B * 2 * (NH - nkv) * T * HD
        grew = plan_drop[nkv] - plan_drop[kv_heads[0]]
        print("%-38s llama memory plan's kept part: drop %d, %d more than at NKV = NH (repeats %d)"
              % (sets, plan_drop[nkv], grew, repeats))
        if grew != repeats:
            fails.append("%s: memory plan's drop grew by %d bytes over NKV = NH, repeats %d" % (sets, grew, repeats))
    return fails


def measured_peak(dmc, tmp, fused):
    args = [dmc, "run", GPT, "--set", MEASURED, "--steps", "1", "--memory", "--quiet",
            "--data", "text:" + os.path.join(ROOT, "README.md")] + ([] if fused else ["--no-fuse-attention"])
    r = subprocess.run(args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       env=dict(os.environ, TMPDIR=tmp), timeout=300)
    if r.returncode != 0:
        raise RuntimeError("dmc run failed:\n" + r.stderr)
    peaks = re.findall(r"^memory rank 0: model peak (\d+) bytes", r.stderr, re.M)
    if len(peaks) != 1:
        raise RuntimeError("no 'memory rank 0: model peak' line in:\n" + r.stderr)
    return int(peaks[0])


def check_measured(dmc):
    fails, got = [], {}
    with tempfile.TemporaryDirectory(prefix="dmc-attention-memory-") as tmp:
        for fused in (True, False):
            predicted = explain(dmc, MEASURED, None, fused)["memory_bytes_per_rank"]["peak_bytes_per_rank"]
            got[fused] = measured_peak(dmc, tmp, fused)
            if got[fused] != predicted:
                fails.append("%s: measured peak %d bytes, --explain predicts %d" % ("fused" if fused else "unfused",
                                                                                   got[fused], predicted))
    d = dims_of(MEASURED, None)
    L, P = d["L"], 4 * d["B"] * d["NH"] * d["T"] * d["T"]
    drop = got[False] - got[True]
    print("%-34s measured peak %.2f -> %.2f MiB: drop %.2f MiB = %.2f x L x P"
          % (MEASURED, got[False] / MIB, got[True] / MIB, drop / MIB, drop / (L * P)))
    if not (L - 1) * P <= drop <= (L + 2) * P:
        fails.append("measured drop %d bytes outside [%d, %d]" % (drop, (L - 1) * P, (L + 2) * P))
    return ["measured %s: %s" % (MEASURED, x) for x in fails]


def check_stage_table(dmc):
    """GPT-2 124M (gpt.dm's dims) B=8 on pipeline=4, 8 micro-batches, fused: each stage's
    activations a micro-batch in the stage table (what it makes and keeps, and what it
    receives) are the memory plan's kept part, stage by stage. They were 30 MiB over on
    stages 0 to 2: the c_attn q/k/v weight windows counted as activations (the cut is
    measured before pass_slice_views makes them views of the parameter) and each stage's
    last output counted on the sender too."""
    plan = explain(dmc, "B=8", "pipeline=4", True, ["--microbatches", "8"])
    fails = []
    for k, (s, m) in enumerate(zip(plan["pipeline"]["stage"], plan["memory_bytes_per_rank"]["stages"])):
        table = s["activation_bytes"] + s["recv_bytes"]
        print("gpt.dm B=8 pipeline=4 stage %d: the stage table's kept %.2f MiB a micro-batch, the memory plan's %.2f MiB"
              % (k, table / MIB, m["activations_kept"] / MIB))
        if table != m["activations_kept"]:
            fails.append("gpt.dm B=8 pipeline=4 stage %d: the stage table keeps %d bytes a micro-batch, the memory plan %d"
                         % (k, table, m["activations_kept"]))
    return fails


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: %s DMC\n" % argv[0])
        return 2
    dmc = os.path.abspath(argv[1])
    fails = []
    for sets, mesh in CASES:
        fails += check_plan(dmc, sets, mesh)
    fails += check_kept(dmc)
    fails += check_kept_grouped(dmc)
    fails += check_stage_table(dmc)
    try:
        fails += check_measured(dmc)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        fails.append(str(e))
    for x in fails:
        print("FAIL: " + x, file=sys.stderr)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
