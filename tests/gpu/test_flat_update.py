"""test_flat_update.py DMC SRCROOT: a serial program's update is one call, the same numbers.

For the simple serial case (codegen/emit_flat_update.c) `dmc -o DIR --target cuda` must
write ONE dmrt_gpu_adamw / dmrt_gpu_sgd call over the parameters laid end to end, and
`--target c` ONE call of its update helper (adamw_update, sgd_update[_no_decay]: the element loop,
written once a file), with a comment at every other update. Checked against the
program's own tables (param_descs, stage_param_offsets, stage_grad_offsets, state_places,
which the checkpoints read):
  - the call covers exactly the updated parameters (first offset to the last one's end),
    their gradients and each state tensor at the same relative offsets;
  - numpy's float32 emulation of the kernels (runtime/cuda/optim.cu: the same float
    operations in the same order, no fused multiply-add) run once over the flat range
    gives bit for bit what it gives run parameter by parameter through the tables, and
    leaves the zero padding between parameters zero.
Programs outside the simple case (--prune, a data=2 mesh, fp16's loss scaling,
--accumulate) keep one call per parameter. The C loop's arithmetic is the emulated one
(dialect_c.c's c_adamw, c_sgd: the same operations; the programs are compiled without
contraction, -std=c11), and the C programs train against PyTorch in the ref suite.
Needs no nvcc: nothing is compiled.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

MLP = ("examples/mlp.dm", ["--set", "B=16,D=48,H=64,K=10"])
GPT = ("examples/gpt.dm", ["--set", "V=64,T=16,C=32,NH=4,L=2,B=4"])
FLAT = [MLP, GPT, ("tests/ref/embed2bw.dm", []), ("tests/ref/attention.dm", [])]
PER_PARAM = [(MLP, ["--prune", "0.5"]), (MLP, ["--mesh", "data=2"]), (MLP, ["--precision", "fp16"]),
             (MLP, ["--accumulate", "2"])]

CALL = re.compile(r"dmrt_gpu_(adamw|sgd)\(ctx->gpu, ([^;]*)\) != DMRT_OK")
# the flat update's ranges (emit_flat_update.c), and the C target's loop over them
RANGE = re.compile(r"\*const (all_\w+) = ctx->(?:params|grads|state) \+ (\d+)")
# (the C dialect's element loop is a helper, written once a file, called per parameter)
C_CALL = re.compile(r"\b(adamw|sgd)_update(?:_no_decay)?\((all_params, all_grads, [^;]*)\);")


def generate(dmc, root, dm, args, target, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    r = subprocess.run([dmc, os.path.join(root, dm), "--target", target, "-o", out] + args,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        raise RuntimeError("dmc %s %s failed: %s" % (dm, " ".join(args), r.stderr))
    name = os.path.splitext(os.path.basename(dm))[0]
    with open(os.path.join(out, name + (".cu" if target == "cuda" else ".c"))) as f:
        return f.read()


def table(src, name):
    """The rows of a generated `static const int64_t name[..][..] = {...}` or descriptor table."""
    found = re.search(r"%s\[[^\]]*\](?:\[[^\]]*\])? = \{\n(.*?)\n\};" % name, src, re.S)
    if not found:  # state_places: a program without optimizer state has none
        return []
    body = found.group(1)
    return [line.strip() for line in body.split("\n") if line.strip()]


def layout(src):
    numel = [int(re.search(r"(\d+)\},?$", row).group(1)) for row in table(src, "param_descs")]
    params = [int(x) for x in re.findall(r"-?\d+", table(src, "stage_param_offsets")[0])]
    grads = [int(x) for x in re.findall(r"-?\d+", table(src, "stage_grad_offsets")[0])]
    states = {}
    for row in table(src, "state_places"):
        p, _, at = (int(x) for x in re.match(r"\{(-?\d+), (-?\d+), (-?\d+)\}", row).groups())
        states.setdefault(p, []).append(at)
    return numel, params, grads, states


def kernel(kind, args, p, g, s):
    """optim.cu's kernels in float32, element-wise over the given arrays (in place)."""
    f = np.float32
    if kind == "adamw":
        b1, omb1, b2, omb2, eps, decay, step_size, bc2 = (f(x) for x in args)
        m, v = s
        pd = p * decay
        m[:] = b1 * m + omb1 * g
        v[:] = b2 * v + (omb2 * g) * g
        denom = np.sqrt(v) / bc2 + eps
        p[:] = pd - step_size * (m / denom)
    else:
        lr, wd, mom, omd, first = (f(x) for x in args)
        d = g + wd * p if wd != 0 else g.copy()
        if s:
            b = d if first else mom * s[0] + omd * d
            s[0][:] = b
            d = b
        p[:] = p - lr * d


def flat_call(src, target, failures, label):
    """(kind, the ranges' offsets by name, the element count) of the one update, or None."""
    ranges = {name: int(at) for name, at in RANGE.findall(src)}
    if target == "cuda":
        calls = CALL.findall(src)
        if len(calls) != 1:
            failures.append("%s: %d update calls, not 1" % (label, len(calls)))
            return None
        kind, args = calls[0][0], [a.strip() for a in calls[0][1].split(",")]
        count = int(args[2 + (2 if kind == "adamw" else 1)])
    else:
        calls = C_CALL.findall(src)
        if len(calls) != 1 or "all_params" not in ranges:
            failures.append("%s: %d update calls over the flat ranges, not 1" % (label, len(calls)))
            return None
        kind = "adamw" if "all_exp_avg_sq" in ranges else "sgd"
        if calls[0][0] != kind:
            failures.append("%s: the flat ranges are %s's, the call %s's" % (label, kind, calls[0][0]))
            return None
        # the element count: the first argument after the buffers
        count = int(next(a for a in (x.strip() for x in calls[0][1].split(",")) if a.isdigit()))
    return kind, ranges, count


def run_flat(src, target, failures, label):
    found = flat_call(src, target, failures, label)
    if not found:
        return None
    kind, ranges, count = found
    numel, params, grads, states = layout(src)
    names = ["all_exp_avg", "all_exp_avg_sq"] if kind == "adamw" else ["all_momentum"]
    S0 = [ranges[n] for n in names if n in ranges]
    n_states = len(S0)
    P0, G0 = ranges["all_params"], ranges["all_grads"]
    last = max(range(len(params)), key=lambda p: params[p])
    if P0 != min(params) or count != params[last] + numel[last] - P0:
        failures.append("%s: the call covers [%d, %d), the parameters [%d, %d)" %
                        (label, P0, P0 + count, min(params), params[last] + numel[last]))
    for p in range(len(params)):
        rel = params[p] - P0
        if grads[p] - G0 != rel or [at - S0[j] for j, at in enumerate(states.get(p, []))] != [rel] * n_states:
            failures.append("%s: parameter %d's gradient or state is not at its offset %d" % (label, p, rel))
    comments = src.count("/* in the one update over every parameter at ")
    if comments != len(params) - 1:
        failures.append("%s: %d updates point at the one call, not %d" % (label, comments, len(params) - 1))
    # the emulation: random regions with zero padding, the flat call against the tables'
    rng = np.random.default_rng(1)
    size = max(at + numel[p] for p in range(len(params)) for at in [params[p], grads[p]] + states.get(p, [])) + 64
    regions = [np.zeros(size, np.float32) for _ in range(2 + n_states)]
    for p in range(len(params)):
        starts = [params[p], grads[p]] + states.get(p, [])[:n_states]
        for r, at in zip(regions, starts):
            r[at:at + numel[p]] = rng.standard_normal(numel[p]).astype(np.float32)
        for at in states.get(p, [])[1:n_states]:
            regions[3][at:at + numel[p]] = np.abs(regions[3][at:at + numel[p]])
    scalars = ([0.9, 0.1, 0.999, 0.001, 1e-8, 1 - 1e-3 * 0.01, 1e-3 / 0.19, 0.0447] if kind == "adamw"
               else [0.1, 1e-4, 0.5, 1.0, 0])
    flat = [r.copy() for r in regions]
    kernel(kind, scalars, flat[0][P0:P0 + count], flat[1][G0:G0 + count],
           [flat[2 + j][S0[j]:S0[j] + count] for j in range(n_states)])
    each = [r.copy() for r in regions]
    for p in range(len(params)):
        n, st = numel[p], states.get(p, [])
        kernel(kind, scalars, each[0][params[p]:params[p] + n], each[1][grads[p]:grads[p] + n],
               [each[2 + j][st[j]:st[j] + n] for j in range(n_states)])
    for k in range(len(regions)):
        if flat[k].tobytes() != each[k].tobytes():
            failures.append("%s: region %d differs between the one call and the per-parameter calls" % (label, k))
    for p in range(len(params)):
        end = params[p] + numel[p]
        pad = flat[0][end:params[p + 1] if p + 1 < len(params) else P0 + count]
        if pad.any():
            failures.append("%s: the padding after parameter %d is not zero" % (label, p))
    return kind


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-flat-update-") as tmp:
        for dm, args in FLAT:
            for target in ("cuda", "c"):
                src = generate(dmc, root, dm, args, target, tmp)
                kind = run_flat(src, target, failures, "%s (%s)" % (dm, target))
                print("%-24s %-4s one %s update over %d parameters" % (dm, target, kind, len(layout(src)[1])))
        for (dm, args), more in PER_PARAM:
            src = generate(dmc, root, dm, args + more, "cuda", tmp)
            calls = len(CALL.findall(src))
            if "One update for the" in src or calls < 6:
                failures.append("%s %s: %d update calls, not one per parameter" % (dm, " ".join(more), calls))
            c_src = generate(dmc, root, dm, args + more, "c", tmp)
            if "One update for the" in c_src or "all_params" in c_src:
                failures.append("%s %s: the C target updates in one loop" % (dm, " ".join(more)))
            print("%-24s %-16s %d calls, one per parameter" % (dm, " ".join(more), calls))
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
