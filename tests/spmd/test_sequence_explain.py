"""test_sequence_explain.py DMC SRCROOT: --explain=json of examples/gpt.dm with
--sequence-parallel against the same plan without it (tensor parallelism alone), by formulas.

For L layers, a per-rank batch b (B over data), T positions, C channels and tensor=t, the
residual stream of gpt.dm has 2L+1 values a layernorm reads ([b, T, C], the embedding's sum
and each block's x_attn and output); each is one allreduce over tensor in the forward pass
without sequence parallelism (the embedding's vocabulary-parallel sum and each c_proj's) and
one in the backward (c_attn's, c_fc's and the head's input gradients). With it:
  - forward and backward: those 2L+1 allreduces of 4bTC bytes are 2L+1 reduce-scatters along
    T (dim 1) of the same operands and 2L+1 all-gathers along T of 4bTC/t, and no allreduce of
    an activation is left;
  - the activation collectives send the same bytes by ring algorithms (2(t-1)/t of 4bTC each
    way), and what is sent besides is the parameter gradients that became sums over tensor:
    the 2(2L+1) layernorm vectors and 2L c_proj biases (C each, an allreduce) and the position
    table (T x C, an all-gather: its gradient is made row-split);
  - the 2L+1 values the backward reads are held as [b, T/t, C]: kept_bytes = (2L+1) 4bTC/t,
    whole_bytes = t kept_bytes. The planned activation arena (its peak, at one moment of the
    step) is smaller, by at most that saving (2L+1) 4bTC (t-1)/t and a packing margin (5%):
    by exactly that with data=1, where the peak is the end of the forward pass, by less
    where other values are live at the peak (data=2 x tensor=2: 61% of it).
"""
import json
import os
import subprocess
import sys

CASES = [  # (mesh, L)
    ("tensor=2", 2), ("tensor=4", 2), ("tensor=2", 3), ("data=2,tensor=2", 2), ("data=2,tensor=4", 3)]
SIZES = {"V": 256, "T": 64, "C": 128, "NH": 4, "B": 4}


def explain(dmc, dm_file, mesh, layers, extra):
    sizes = ",".join("%s=%d" % kv for kv in dict(SIZES, L=layers).items())
    cmd = [dmc, "--explain=json", dm_file, "--set", sizes, "--mesh", mesh] + extra
    r = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s exited %d" % (" ".join(cmd), r.returncode))
    return json.loads(r.stdout)


def activation_collectives(plan, phase, op, elems_whole):
    """Collectives of one kind over tensor in one phase whose whole value has elems_whole
    floats (the [B, T, C] activations)."""
    out = []
    for c in plan["collectives"]:
        if c["phase"] != phase or c["axis"] != "tensor" or c["op"] != op:
            continue
        whole = c["bytes_per_rank"] * (plan_tensor(plan) if op == "allgather" else 1) // 4
        if whole == elems_whole:
            out.append(c)
    return out


def plan_tensor(plan):
    return next(a["size"] for a in plan["mesh"] if a["axis"] == "tensor")


def check(cond, what, failures):
    print("%s %s" % ("ok  " if cond else "FAIL", what))
    if not cond:
        failures.append(what)


def main():
    dmc, root = sys.argv[1:3]
    dm_file = os.path.join(root, "examples", "gpt.dm")
    failures = []
    for mesh, layers in CASES:
        axes = dict(kv.split("=") for kv in mesh.split(","))
        t, d = int(axes["tensor"]), int(axes.get("data", 1))
        b, T, C = SIZES["B"] // d, SIZES["T"], SIZES["C"]
        n = 2 * layers + 1
        act = b * T * C  # floats of one rank's [b, T, C]
        plain = explain(dmc, dm_file, mesh, layers, [])
        sp = explain(dmc, dm_file, mesh, layers, ["--sequence-parallel"])
        tag = "%s L=%d:" % (mesh, layers)
        sent = {}
        for phase in ("forward", "backward"):
            ar = activation_collectives(plain, phase, "allreduce", act)
            rs = activation_collectives(sp, phase, "reduce_scatter", act)
            ag = activation_collectives(sp, phase, "allgather", act)
            left = activation_collectives(sp, phase, "allreduce", act)
            check(len(ar) == n, "%s %s: %d allreduces of [b, T, C] without (want %d)" % (tag, phase, len(ar), n), failures)
            check(len(rs) == n and all(c["dim"] == 1 for c in rs),
                  "%s %s: %d reduce-scatters along T with (want %d)" % (tag, phase, len(rs), n), failures)
            check(len(ag) == n and all(c["dim"] == 1 for c in ag),
                  "%s %s: %d all-gathers along T with (want %d)" % (tag, phase, len(ag), n), failures)
            check(not left, "%s %s: no allreduce of [b, T, C] left with (%d)" % (tag, phase, len(left)), failures)
            ring = 2 * 4 * act * (t - 1) / t
            plain_sent = sum(c["sent_bytes_per_rank"] for c in ar)
            sp_sent = sum(c["sent_bytes_per_rank"] for c in rs + ag)
            check(abs(plain_sent - n * ring) < 1 and abs(sp_sent - plain_sent) < 1,
                  "%s %s: activation bytes sent %d with, %d without, formula %d" % (tag, phase, sp_sent, plain_sent, n * ring),
                  failures)
            sent[phase] = (plain_sent, sp_sent)
        extra = (2 * n + 2 * layers) * C * 4 * 2 * (t - 1) / t + T * C * 4 * (t - 1) / t
        got = sp["communication"]["sent_bytes_per_rank"] - plain["communication"]["sent_bytes_per_rank"]
        check(abs(got - extra) < 1, "%s bytes sent besides: %d, formula %d" % (tag, got, extra), failures)
        s = sp["sequence_parallel"]
        check("sequence_parallel" not in plain, "%s no sequence_parallel section without" % tag, failures)
        check(s["forward_reduce_scatters"] == n and s["forward_all_gathers"] == n,
              "%s summary: %d reduce-scatters, %d all-gathers (want %d)" % (tag, s["forward_reduce_scatters"],
                                                                          s["forward_all_gathers"], n), failures)
        kept = n * 4 * act / t
        check(s["kept_values"] == n and s["kept_bytes"] == kept and s["whole_bytes"] == t * kept,
              "%s kept for the backward: %d values, %d bytes of %d (want %d, %d of %d)"
              % (tag, s["kept_values"], s["kept_bytes"], s["whole_bytes"], n, kept, t * kept), failures)
        saved = plain["memory_bytes_per_rank"]["activations"] - sp["memory_bytes_per_rank"]["activations"]
        bound = n * 4 * act * (t - 1) // t
        check(0 < saved <= 1.05 * bound, "%s activation arena: %d bytes less (the kept values' saving: %d)"
              % (tag, saved, bound), failures)
    check_llama(dmc, os.path.join(root, "examples", "llama.dm"), failures)
    print("%d failed" % len(failures))
    return 1 if failures else 0


def check_llama(dmc, dm_file, failures):
    """llama.dm's RMSNorm (x * rsqrt(mean(x^2)) * weight) reads its output gradient twice in
    the backward, for the weight's gradient and, times the weight, for the input's: one
    reduce-scatter serves both, so the backward mirrors the forward there too: 2L+1
    reduce-scatters and all-gathers per phase (it had 2(2L+1) reduce-scatters)."""
    sizes = dict(SIZES, F=256)
    for mesh, layers in (("tensor=2", 2), ("data=2,tensor=2", 3)):
        axes = dict(kv.split("=") for kv in mesh.split(","))
        d = int(axes.get("data", 1))
        n, act = 2 * layers + 1, sizes["B"] // d * sizes["T"] * sizes["C"]
        size_arg = ",".join("%s=%d" % kv for kv in dict(sizes, L=layers).items())
        plans = []
        for extra in ([], ["--sequence-parallel"]):
            cmd = [dmc, "--explain=json", dm_file, "--set", size_arg, "--mesh", mesh] + extra
            r = subprocess.run(cmd, stdout=subprocess.PIPE, universal_newlines=True, timeout=120)
            if r.returncode != 0:
                raise SystemExit("FAIL: %s exited %d" % (" ".join(cmd), r.returncode))
            plans.append(json.loads(r.stdout))
        plain, sp = plans
        tag = "llama.dm %s L=%d:" % (mesh, layers)
        for phase in ("forward", "backward"):
            ar = activation_collectives(plain, phase, "allreduce", act)
            rs = activation_collectives(sp, phase, "reduce_scatter", act)
            ag = activation_collectives(sp, phase, "allgather", act)
            # (without: the backward's residual gradients join one pending sum where two meet,
            # one allreduce fewer; each is still one reduce-scatter with)
            want_ar = n if phase == "forward" else n - 1
            check(len(ar) == want_ar and len(rs) == n and len(ag) == n,
                  "%s %s: %d allreduces of [b, T, C] without (want %d), %d reduce-scatters and %d all-gathers "
                  "with (want %d)" % (tag, phase, len(ar), want_ar, len(rs), len(ag), n), failures)


if __name__ == "__main__":
    sys.exit(main())
