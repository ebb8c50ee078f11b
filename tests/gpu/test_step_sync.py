"""test_step_sync.py DMC SRCROOT: a serial CUDA program's step waits for the device once, at its end.

The runtime functions that make the host wait for the device are listed in one place,
DMRT_GPU_SYNCHRONISING in runtime/cuda/dmrt_cuda.h. For each case, `dmc --target cuda`
writes <model>.cu (nothing is compiled: no nvcc, no GPU), and every function the step
reaches from <model>_train_step and <model>_forward (by the names their bodies call) is
read: the only synchronising call allowed is finish_step's one dmrt_gpu_step_end, which
the train step calls after run_update and the forward after run_forward; the inputs go
up with dmrt_gpu_upload at offsets inside the reserve create makes; a clipped program's
norm and factor are the device's (dmrt_gpu_clip_squares, _factor, _scale). fp16's loss scaling, --prune
and meshes keep their phases' checks (dmrt_gpu_fault_take), which the test also asserts,
so that the list of what still synchronises (docs/gpu.md) stays true.

Also, on pipelines (mlp.dm and gpt.dm, pipeline=2): an output accessor copies the output's
device buffer to the host only on the stage whose buffer holds it, the stage the
allocation sizes it on (the others' has no bytes: a copy there read past the device block).
"""
import os
import re
import subprocess
import sys
import tempfile

TINY_GPT = "V=64,T=16,C=32,NH=4,L=2,B=4"
SMALL_MLP = "B=16,D=48,H=64,K=10"
# (name, .dm, --set, extra dmc arguments, synchronising calls allowed besides step_end,
#  whether the step ends in finish_step)
CASES = [
    ("mlp", "examples/mlp.dm", SMALL_MLP, [], set(), True),
    ("gpt", "examples/gpt.dm", TINY_GPT, [], set(), True),
    ("gpt-bf16", "examples/gpt.dm", TINY_GPT, ["--precision", "bf16"], set(), True),
    # llama.dm and clip.dm clip their gradients: the norm and the factor on the device
    ("llama", "examples/llama.dm", "V=64,T=8,C=32,NH=4,F=48,L=2,B=4", [], set(), True),
    ("dropout", "tests/spmd/dropout.dm", "B=16,D=32,H=64,K=8", [], set(), True),
    ("clip", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", [], set(), True),
    # kept as they were: the phases check the fault record (see the module's text)
    ("gpt-prune", "examples/gpt.dm", TINY_GPT, ["--prune", "0.5"], None, False),
    ("gpt-data2", "examples/gpt.dm", TINY_GPT, ["--mesh", "data=2"], None, False),
]


def synchronising(root):
    with open(os.path.join(root, "runtime", "cuda", "dmrt_cuda.h")) as f:
        text = f.read()
    m = re.search(r"#define DMRT_GPU_SYNCHRONISING((?:[^\n]*\\\n)*[^\n]*)", text)
    if not m:
        raise SystemExit("FAIL: dmrt_cuda.h has no DMRT_GPU_SYNCHRONISING")
    names = " ".join(re.findall(r'"([^"]*)"', m.group(1))).split()
    assert "dmrt_gpu_copy" in names and "dmrt_gpu_step_end" in names, names
    return names


def functions(source):
    """{name: body} of the file's top-level functions (a line ending in '{' at column 0 up
    to the next '}' at column 0)."""
    out = {}
    for m in re.finditer(r"^[A-Za-z_][^\n;]*?\b(\w+)\(([^\n]*)\) \{\n(.*?)^\}", source, re.S | re.M):
        out[m.group(1)] = m.group(3)
    return out


def reached(funcs, roots):
    seen, pending = set(), list(roots)
    while pending:
        name = pending.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        pending.extend(re.findall(r"\b(\w+)\(", funcs[name]))
    return seen


def calls(body, names):
    """The synchronising calls of body, line by line (a device-to-device dmrt_gpu_copy
    does not wait)."""
    lines = [line for line in body.split("\n") if "DMRT_DEVICE_TO_DEVICE" not in line]
    return [n for line in lines for n in names for _ in re.finditer(r"\b%s\(" % n, line)]


def check(name, source, model, sync, allowed, ends):
    funcs = functions(source)
    step = reached(funcs, ["%s_train_step" % model, "%s_forward" % model])
    found = {f: calls(funcs[f], sync) for f in step}
    found = {f: c for f, c in found.items() if c}
    if not ends:
        # kept: a phase still takes the fault record, and no finish_step
        if "finish_step" in funcs or not any("dmrt_gpu_fault_take" in c for c in found.values()):
            return "expected the phases' dmrt_gpu_fault_take and no finish_step, got %s" % found
        return None
    if found.get("finish_step") != ["dmrt_gpu_step_end"]:
        return "finish_step must call dmrt_gpu_step_end once, found %s" % found.get("finish_step")
    others = {f: c for f, c in found.items() if f != "finish_step" and set(c) - allowed}
    if others:
        return "synchronising calls inside the step: %s" % others
    train, forward = funcs["%s_train_step" % model], funcs["%s_forward" % model]
    if not re.search(r"run_update\(ctx, batch\);.*finish_step\(ctx, loss\)", train, re.S):
        return "the train step must end in finish_step after run_update:\n" + train
    if train.count("finish_step(") != 1 or forward.count("finish_step(") != 1:
        return "finish_step once in each of train_step and forward"
    if "dmrt_gpu_upload(" not in forward or "dmrt_gpu_upload(" not in train:
        return "the inputs must go up with dmrt_gpu_upload"
    reserve = re.search(r"dmrt_gpu_upload_reserve\(ctx->gpu, (\d+)\)", source)
    ups = re.findall(r"dmrt_gpu_upload\(ctx->gpu, [^,]+, [^,]+, (\d+) \* sizeof\((\w+)\), (\d+)\)", train)
    size = {"float": 4, "int32_t": 4, "uint16_t": 2}
    if not reserve or not ups or any(int(o) + int(n) * size[t] > int(reserve.group(1)) for n, t, o in ups):
        return "uploads %s outside the reserve %s" % (ups, reserve and reserve.group(1))
    if "ctx->step--" not in train:
        return "a faulting step must not count (ctx->step--)"
    if "clip =" in funcs.get("run_update", "") and not re.search(
            r"dmrt_gpu_clip_squares\(.*dmrt_gpu_clip_factor\(.*dmrt_gpu_clip_scale\(", funcs["run_update"], re.S):
        return "clipping must sum, compute its factor and scale on the device"
    return None


PIPELINE_CASES = [
    ("mlp-pipeline", "examples/mlp.dm", "B=64,D=8,H=16,K=512", ["--mesh", "pipeline=2", "--microbatches", "2"]),
    ("gpt-pipeline", "examples/gpt.dm", TINY_GPT, ["--mesh", "pipeline=2", "--microbatches", "2"]),
]


def check_pipeline_outputs(source, model):
    """The reason an output accessor copies off its stage, or None."""
    funcs = functions(source)
    outputs = re.findall(r"^\s*at\[\d+\] = .*\(ctx->coord\[PIPELINE_AXIS\] == (\d+) \? \d+ : 0\).*/\* output_(\w+) \*/",
                         source, re.M)
    if not outputs:
        return "no output sized by stage (the allocation's form changed?)"
    for stage, name in outputs:
        body = funcs.get("%s_output_%s" % (model, name), "")
        copy = re.search(r"^( *)if \(dmrt_gpu_copy\(ctx->gpu, ctx->host_output_%s, .*DMRT_DEVICE_TO_HOST\)" % name, body, re.M)
        if not copy:
            return "%s_output_%s: no copy to the host found" % (model, name)
        guard = "if (ctx->coord[PIPELINE_AXIS] == %s) {" % stage
        before = body[:copy.start()].rstrip().splitlines()
        if not before or before[-1].strip().split(" /*")[0] != guard:
            return "%s_output_%s copies its device buffer on every stage (want it under `%s`)" % (model, name, guard)
    return None


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    sync = synchronising(root)
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-step-sync-") as tmp:
        for i, (name, dm, sets, extra, allowed, ends) in enumerate(CASES):
            out = os.path.join(tmp, str(i))
            cmd = [dmc, os.path.join(root, dm), "--target", "cuda", "--set", sets, "-o", out] + extra
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
            if r.returncode != 0:
                failures.append("%s: dmc exited %d: %s" % (name, r.returncode, r.stderr))
                continue
            cu = [f for f in os.listdir(out) if f.endswith(".cu")]
            with open(os.path.join(out, cu[0])) as f:
                source = f.read()
            why = check(name, source, cu[0][:-3], sync, allowed or set(), ends)
            print("%-10s %s" % (name, "ok" if not why else "FAIL: " + why))
            if why:
                failures.append("%s: %s" % (name, why))
        for i, (name, dm, sets, extra) in enumerate(PIPELINE_CASES):
            out = os.path.join(tmp, "pipeline-%d" % i)
            r = subprocess.run([dmc, os.path.join(root, dm), "--target", "cuda", "--set", sets, "-o", out] + extra,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
            why = "dmc exited %d: %s" % (r.returncode, r.stderr) if r.returncode else None
            if not why:
                cu = [f for f in os.listdir(out) if f.endswith(".cu")][0]
                with open(os.path.join(out, cu)) as f:
                    why = check_pipeline_outputs(f.read(), cu[:-3])
            print("%-12s %s" % (name, "ok" if not why else "FAIL: " + why))
            if why:
                failures.append("%s: %s" % (name, why))
    print("%d passed, %d failed" % (len(CASES) + len(PIPELINE_CASES) - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
