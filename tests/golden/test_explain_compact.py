#!/usr/bin/env python3
"""test_explain_compact.py DMC: `dmc --explain` reads in a screen at any size, and says
what `--explain=json` says.

GPT-2 124M (examples/gpt.dm) on data=2 x tensor=2 x pipeline=2 must print under 60
lines, its 148 parameters in 16 (the 12 layers' 12 parameters a line each), and the same
with 48 layers. For every case, against the JSON of the same plan (an oracle printed
line by line, without grouping):
  - inputs, parameters and outputs: each printed line's name, its `{a..b}` and `{a,b}`
    index lists expanded, gives exactly the JSON's list of (name, type, line), and the
    lines come in the order of their first member;
  - collectives: one row per (phase, axis, kind) of the JSON's collectives, in phase and
    mesh order; each row's calls (2 for allgather+allreduce), operand and sent bytes are
    the sums over them per step (a forward or backward one once per micro-batch), and the
    header's the sums over all; the largest values named are
    the groups of largest total (values alike but for their first numeric dot-part,
    grouped here independently), their names expanded are exactly those values and
    their bytes their sums, and "+N more" counts the rest;
  - memory: each stage's peak is the JSON's peak_bytes_by_stage, and the parts printed
    (JSON, the table, --explain=full) sum to it (2bw and pipedream among the cases);
    --memory-gb refuses a plan whose stage's peak is over it, and takes one just fitting.
`--explain=full` keeps every line: a line per parameter and per collective, in the
JSON's order, and the schedule's grid where there is a pipeline (tests/golden holds the
full form byte for byte as it was before the default was compacted).
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT, MLP, FORMS = "examples/gpt.dm", "examples/mlp.dm", "tests/spmd/forms.dm"
GPT2_MESH = ["--mesh", "data=2,tensor=2,pipeline=2"]
CASES = [
    (GPT, GPT2_MESH),
    (GPT, GPT2_MESH + ["--set", "L=48"]),
    (GPT, ["--mesh", "pipeline=4", "--microbatches", "8", "--set", "B=8"]),
    (GPT, ["--mesh", "data=2,tensor=2", "--zero", "2"]),
    (MLP, []),
    (MLP, ["--mesh", "data=2,tensor=2"]),
    (MLP, ["--mesh", "data=4", "--zero", "3", "--bucket-mb", "1"]),
    (FORMS, ["--mesh", "data=2,tensor=2"]),
    (MLP, ["--mesh", "data=2", "--param-servers", "2"]),
    # weight versions and the previous batch's inputs: parts of the peak printed too
    (MLP, ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw"]),
    (GPT, ["--mesh", "pipeline=4", "--microbatches", "8", "--set", "B=8", "--schedule", "pipedream"]),
]
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
SIZE = r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)"
ROW = re.compile(r"^  (forward|backward|update) +(\S+) +(\S+) +(\d+) +(%s) +(%s)  (.*)$" % (SIZE, SIZE))
PHASES = ["forward", "backward", "update"]

failures = []


def check(ok, what):
    print("%s %s" % ("ok  " if ok else "FAIL", what))
    if not ok:
        failures.append(what)
    return ok


def dmc_out(dmc, dm, args, form):
    r = subprocess.run([dmc, form, os.path.join(ROOT, dm)] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, cwd=ROOT)
    if r.returncode != 0 or r.stderr:
        raise RuntimeError("dmc %s %s %s: exit %d: %s" % (form, dm, " ".join(args), r.returncode, r.stderr.strip()))
    return r.stdout


def expand(pattern):
    """h.{0..2}.w -> [h.0.w, h.1.w, h.2.w]; {0,3..4} -> 0, 3, 4; several braces multiply."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    indices = []
    for item in m.group(1).split(","):
        lo, _, hi = item.partition("..")
        indices += range(int(lo), int(hi or lo) + 1)
    return [name for i in indices for name in expand(pattern[:m.start()] + str(i) + pattern[m.end():])]


def close(printed, actual):
    """printed "72.00 MiB" stands for actual bytes: rounded to its last digit."""
    value, unit = printed.split()
    digits = len(value.split(".")[1]) if "." in value else 0
    return abs(float(value) - actual / UNITS[unit]) <= 0.5 * 10 ** -digits + 1e-9


def section(lines, title):
    """The indented lines under a line starting with title, and that line."""
    for i, line in enumerate(lines):
        if line.startswith(title):
            j = i + 1
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            return line, lines[i + 1:j]
    return None, []


def check_values(what, lines, plan, key, title):
    head, rows = section(lines, title)
    want = [(v["name"], v["type"], v["line"]) for v in plan[key]]
    if not want:
        return check(head is None, "%s: no %s section, as the JSON lists none" % (what, title))
    got, firsts, bad = [], [], []
    for row in rows:
        m = re.match(r"^  (\S+) +(.+?) +line (\d+)$", row)
        if not m:
            bad.append(row)
            continue
        names = expand(m.group(1))
        got += [(n, m.group(2), int(m.group(3))) for n in names]
        firsts.append(want.index(got[-len(names)]) if got[-len(names)] in want else -1)
    check(not bad and sorted(got) == sorted(want),
          "%s: the %d %s lines expand to the JSON's %d %s (%s)" % (what, len(rows), title, len(want), key,
                                                                  bad or sorted(set(got) ^ set(want))[:4]))
    check(firsts == sorted(firsts) and -1 not in firsts, "%s: %s lines in the order of their first member" % (what, title))
    return len(rows)


def layer_key(name):
    """The name with its first all-digit dot-part taken out: what one printed line covers."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if re.fullmatch(r"0|[1-9][0-9]{0,7}", part):
            return ".".join(parts[:i] + ["#"] + parts[i + 1:])
    return name


def check_largest(what, text, items):
    m = re.match(r"^(.*?)(?: \(\+(\d+) more\))?$", text)
    shown = m.group(1).split(", ")
    totals = {}
    for c in items:
        totals.setdefault(layer_key(c["value"]), []).append(c)
    order = sorted(totals.values(), key=lambda cs: -sum(c["bytes_per_rank"] for c in cs))
    problems = []
    if int(m.group(2) or 0) != len(totals) - len(shown) or len(shown) != min(2, len(totals)):
        problems.append("%d shown and %s more of %d groups" % (len(shown), m.group(2), len(totals)))
    for rank, entry in enumerate(shown):
        e = re.match(r"^(\S+)(?: (%s))?$" % SIZE, entry)
        if not e:
            problems.append("unreadable %r" % entry)
            continue
        names = set(expand(e.group(1)))
        group = [c for c in items if c["value"] in names]
        total = sum(c["bytes_per_rank"] for c in group)
        if not group or {layer_key(c["value"]) for c in group} != {layer_key(next(iter(names)))} or \
                names != {c["value"] for c in group}:
            problems.append("%s is not one group of values alike but for an index" % e.group(1))
        if (e.group(2) is None) != (len(totals) == 1) or (e.group(2) and not close(e.group(2), total)):
            problems.append("%s: %s for %d bytes" % (e.group(1), e.group(2), total))
        if rank < len(order) and not close("%.6f B" % total, sum(c["bytes_per_rank"] for c in order[rank])):
            problems.append("%s (%d bytes) is not the %d-th largest" % (e.group(1), total, rank + 1))
    return problems


def per_step(plan, cs):
    """The JSON's collectives (one call each) as a step makes them: a forward or backward one
    once per micro-batch, its bytes and calls (`times`) multiplied by the step's micro-batches
    (the pipeline's M, 1 without one); an update's once."""
    m = plan["pipeline"]["microbatches"] if "pipeline" in plan else 1
    out = []
    for c in cs:
        t = 1 if c["phase"] == "update" else m
        out.append(dict(c, times=t, bytes_per_rank=t * c["bytes_per_rank"],
                        sent_bytes_per_rank=t * c["sent_bytes_per_rank"]))
    return out


def plan_collectives(plan):
    """The collectives a step makes: the reshard list's, but those ZeRO or the parameter servers
    replace, then ZeRO's
    reduce-scatters and all-gathers (from its own section of the JSON), per step (per_step)."""
    kept = [c for c in plan["collectives"] if not c.get("replaced_by_zero") and not c.get("replaced_by_param_servers")]
    return per_step(plan, kept + plan.get("zero", {}).get("collectives", []))


HEADER = re.compile(r"collectives: (\d+) per step on (%s) of operands (?:per rank; by ring algorithms each rank sends (%s)|"
                    r"over the pipeline's stages; by ring algorithms a rank sends its own stages' \(and receives as much\): "
                    r"on pipeline rank 0 (%s)((?:, \d+ %s)*))" % (SIZE, SIZE, SIZE, SIZE))


def header_sent(plan, head, cs):
    """The collectives header (HEADER's match, or None) and whether its sent figures are the
    collectives cs's sums: one per rank, or with pipeline stages one per pipeline coordinate
    (its stages' collectives alone: stage % ranks)."""
    m = HEADER.match(head)
    if not m:
        return None, False
    if m.group(3):
        return m, close(m.group(3), sum(c["sent_bytes_per_rank"] for c in cs))
    ranks = plan["pipeline"]["ranks"]
    printed = [m.group(4)] + re.findall(r", \d+ (%s)" % SIZE, m.group(5))
    want = [sum(c["sent_bytes_per_rank"] for c in cs if c["stage"] % ranks == r) for r in range(ranks)]
    return m, len(printed) == ranks and all(close(p, w) for p, w in zip(printed, want))


def check_zero_collectives(what, plan):
    """ZeRO's collectives against its buckets: a reduce-scatter of each bucket, an all-gather of
    each bucket held whole, the gathers of those held in shares; ring traffic (k-1)/k."""
    zero = plan.get("zero")
    if not zero:
        return
    size = {a["axis"]: a["size"] for a in plan["mesh"]}
    cs, buckets = zero["collectives"], zero["buckets"]
    scatters = [c for c in cs if c["op"] == "reduce_scatter"]
    whole = [b for b in buckets if not b["parameters_in_shares"]]
    gathers = [c for c in cs if c["op"] == "allgather" and c["phase"] == "update"]
    early = [c for c in cs if c["phase"] != "update"]
    ok = len(scatters) == len(buckets) and len(gathers) == len(whole) and len(early) == zero["gathers"]
    ok = ok and sum(c["bytes_per_rank"] for c in scatters) == 4 * sum(b["elements"] for b in buckets)
    k = size[buckets[0]["axis"]]
    ok = ok and all(close("%.6f B" % c["sent_bytes_per_rank"], 4 * buckets[c["bucket"]]["elements"] * (k - 1) / k)
                    for c in cs)
    ok = ok and close("%.6f B" % sum(c["bytes_per_rank"] for c in early), 4 * zero["gathered_elements"] / k)
    ok = ok and not any(c["op"] == "allreduce" and c["phase"] == "update" and c["axis"] == buckets[0]["axis"]
                        and not c.get("replaced_by_zero") for c in plan["collectives"]
                        if any(c["value"].startswith(b["first"]) for b in buckets))
    check(ok, "%s: ZeRO's %d collectives are its %d buckets' reduce-scatters, %d all-gathers and %d gathers" %
          (what, len(cs), len(buckets), len(whole), zero["gathers"]))


def check_collectives(what, lines, plan):
    check_zero_collectives(what, plan)
    groups, order = {}, []
    for c in plan_collectives(plan):
        key = (c["phase"], c["axis"], c["op"])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(c)
    head = next((l for l in lines if l.startswith("collectives:")), "")
    if not groups:
        return check(head.startswith("collectives: none"), "%s: no collectives, as the JSON lists none" % what)
    axes = [a["axis"] for a in plan["mesh"]]
    order.sort(key=lambda k: (PHASES.index(k[0]), axes.index(k[1])))  # stable: first appearance within
    rows = [ROW.match(l) for l in lines if ROW.match(l)]
    check([(r.group(1), r.group(2), r.group(3)) for r in rows] == order,
          "%s: a row per (phase, axis, kind) of the JSON's collectives, in phase and mesh order: %s" %
          (what, [(r.group(1), r.group(2), r.group(3)) for r in rows]))
    calls = lambda cs: sum((2 if c["op"] == "allgather+allreduce" else 1) * c["times"] for c in cs)
    bad = []
    for r in rows:
        cs = groups.get((r.group(1), r.group(2), r.group(3)), [])
        nbytes, sent = sum(c["bytes_per_rank"] for c in cs), sum(c["sent_bytes_per_rank"] for c in cs)
        if int(r.group(4)) != calls(cs) or not close(r.group(5), nbytes) or not close(r.group(6), sent):
            bad.append("%s: %s calls %s %s, JSON %d %d %.0f" % (r.group(0)[:40], r.group(4), r.group(5), r.group(6),
                                                              calls(cs), nbytes, sent))
        if cs and "bucket" in cs[0]:  # ZeRO's rows name what they move, not a value
            if not r.group(7).startswith("ZeRO"):
                bad.append("%s: largest %r does not name ZeRO" % (r.group(0)[:40], r.group(7)))
            continue
        bad += ["%s %s %s: %s" % (r.group(1), r.group(2), r.group(3), p) for p in check_largest(what, r.group(7), cs)]
    check(not bad, "%s: each row's calls, operand and sent bytes and largest values are the JSON's %s" % (what, bad[:3]))
    cs = plan_collectives(plan)
    m, sent_ok = header_sent(plan, head, cs)
    check(m and int(m.group(1)) == calls(cs) and close(m.group(2), sum(c["bytes_per_rank"] for c in cs)) and sent_ok,
          "%s: the header's calls and bytes are the sums over the JSON (%s)" % (what, head[:100]))
    return len(rows)


MEMORY_ROW = re.compile(r"^  (stage \d+|rank \d+|rank) +(\d[\d. ]*)$")
NOT_IN_TOTAL = ("total", "gathered_outputs_on_request")


def check_memory(what, lines, plan):
    rows = [MEMORY_ROW.match(l) for l in lines]
    rows = [[float(x) for x in m.group(2).split()] for m in rows if m]
    stages = plan["memory_bytes_per_rank"]["peak_bytes_by_stage"]
    peaks = [p["total"] for p in stages]
    check(len(rows) == len(peaks) and all(close("%.2f MiB" % r[0], p) for r, p in zip(rows, peaks)),
          "%s: each stage's peak is the JSON's %s" % (what, peaks))
    # every part is printed: the JSON's to the byte, the table's within its rounding
    # (2bw and pipedream printed neither the previous inputs nor, in the JSON, their last
    # stage's parts: the parts fell short of the peak)
    sums = [sum(v for k, v in p.items() if k not in NOT_IN_TOTAL) for p in stages]
    check(sums == peaks, "%s: --explain=json's parts of each stage's peak sum to it (%s, %s)" % (what, sums, peaks))
    check(all(abs(sum(r[1:]) - r[0]) <= 0.005 * len(r) for r in rows),
          "%s: the table's parts of each stage's peak sum to it (%s)" % (what, rows))


FULL_PEAK = re.compile(r"peak (\S+) MiB allocated \((\d+) bytes\): (.*)$")


def check_full_memory(what, lines, plan):
    """--explain=full's peak lines: their parts (MiB, up to the host memory after ';') sum to the peak."""
    peaks = [p["total"] for p in plan["memory_bytes_per_rank"]["peak_bytes_by_stage"]]
    got = []
    for l in lines:
        m = FULL_PEAK.search(l)
        if not m:
            continue
        parts = [float(x) for x in re.findall(r"(\d+\.\d+) MiB", m.group(3).split(";")[0])]
        got.append(int(m.group(2)))
        check(abs(sum(parts) * (1 << 20) - int(m.group(2))) <= 0.005 * (1 << 20) * len(parts),
              "%s: --explain=full's parts of a peak sum to it (%s: %s)" % (what, m.group(2), parts))
    check(got == peaks, "%s: --explain=full prints each stage's peak (%s, %s)" % (what, got, peaks))


def check_full(what, full, plan):
    lines = full.splitlines()
    _, params = section(lines, "params:")
    check([p.split()[0] for p in params] == [p["name"] for p in plan["params"]],
          "%s: --explain=full lists every parameter on its line (%d)" % (what, len(params)))
    _, rows = section(lines, "  phase    collective")
    cs = plan["collectives"]
    check(len(rows) == len(cs) and all(r.split()[0] == c["phase"] and " %s " % c["value"] in r for r, c in zip(rows, cs)),
          "%s: --explain=full lists every collective on its line (%d)" % (what, len(rows)))
    if "pipeline" in plan and plan["pipeline"]["stages"] > 1:
        check(any(l.startswith("  stage 0   F0") for l in lines), "%s: --explain=full draws the schedule" % what)
    # the full list's header sums its rows, but those the parameter servers replace, which it counts apart
    servers = [c for c in cs if c.get("replaced_by_param_servers")]
    counted = per_step(plan, [c for c in cs if not c.get("replaced_by_param_servers")])
    head = " ".join(l for l in lines if l.startswith("collectives:") or l.startswith("receives as much"))
    if not cs:
        check(head.startswith("collectives: none"), "%s: --explain=full says there are no collectives" % what)
        return
    m, sent_ok = header_sent(plan, head, counted)
    calls = sum((2 if c["op"] == "allgather+allreduce" else 1) * c["times"] for c in counted)
    check(m and int(m.group(1)) == calls and close(m.group(2), sum(c["bytes_per_rank"] for c in counted)) and sent_ok and
          (("not counted: the %d listed below that the parameter servers replace" % len(servers)) in head) == bool(servers),
          "%s: --explain=full's header sums the rows the parameter servers do not replace (%d of %d; %s)" %
          (what, len(counted), len(cs), head[:160]))


def check_memory_limit(dmc):
    """--memory-gb holds each stage's planned peak (the table's), not only the cut search's
    estimate: GPT-2 124M B=8 on pipeline=4, 8 micro-batches, was accepted at 2.6 GiB with
    stage 3 at 4206 MiB."""
    args = [os.path.join(ROOT, GPT), "--set", "B=8", "--mesh", "pipeline=4", "--microbatches", "8"]
    plan = json.loads(dmc_out(dmc, GPT, args[1:], "--explain=json"))
    peaks = [p["total"] for p in plan["memory_bytes_per_rank"]["peak_bytes_by_stage"]]
    worst = max(range(len(peaks)), key=lambda k: peaks[k])
    r = subprocess.run([dmc, "--explain"] + args + ["--memory-gb", "2.6"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, cwd=ROOT)
    # (the limit moves the cuts: the stage refused is the limited plan's, over 2.6 GiB)
    m = re.search(r"error: pipeline stage (\d+) allocates (\S+) MiB at its peak \(the memory plan, --explain's "
                  r"memory table\), over --memory-gb 2.6 \(2662.40 MiB\)", r.stderr)
    check(r.returncode != 0 and m and float(m.group(2)) > 2662.40,
          "--memory-gb 2.6 refuses a plan whose stage's peak is over it, naming the stage and both numbers (%s)"
          % r.stderr.strip()[:300])
    fits = "%.9f" % ((peaks[worst] + 1) / 2**30)
    r = subprocess.run([dmc, "--explain"] + args + ["--memory-gb", fits], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, cwd=ROOT)
    check(r.returncode == 0, "--memory-gb %s (the largest peak, and a byte) is accepted (%s)" % (fits, r.stderr.strip()[:300]))


def main():
    dmc = os.path.abspath(sys.argv[1])
    check_memory_limit(dmc)
    lengths = {}
    for dm, args in CASES:
        what = " ".join([os.path.basename(dm)] + args)
        text = dmc_out(dmc, dm, args, "--explain")
        plan = json.loads(dmc_out(dmc, dm, args, "--explain=json"))
        lines = text.splitlines()
        lengths[tuple(args)] = len(lines)
        n_param_lines = check_values(what, lines, plan, "params", "params")
        check_values(what, lines, plan, "inputs", "inputs")
        check_values(what, lines, plan, "outputs", "outputs")
        check_collectives(what, lines, plan)
        check_memory(what, lines, plan)
        full = dmc_out(dmc, dm, args, "--explain=full")
        check_full(what, full, plan)
        check_full_memory(what, full.splitlines(), plan)
        if dm == GPT and args == GPT2_MESH:
            check(len(lines) < 60, "GPT-2 124M on data=2 x tensor=2 x pipeline=2: %d lines (under 60)" % len(lines))
            check(len(plan["params"]) == 148 and n_param_lines == 16,
                  "GPT-2 124M: %d parameters on %d lines (148 on 16)" % (len(plan["params"]), n_param_lines))
            check(not any(re.match(r"^  stage \d+ +[FB.] ", l) for l in lines), "the default draws no schedule grid")
    twelve, deep = lengths[tuple(GPT2_MESH)], lengths[tuple(GPT2_MESH + ["--set", "L=48"])]
    check(deep == twelve, "GPT with 48 layers prints as many lines as with 12 (%d, %d)" % (deep, twelve))
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
