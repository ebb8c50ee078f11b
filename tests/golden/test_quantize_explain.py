#!/usr/bin/python3
"""test_quantize_explain.py: `dmc --explain --quantize MODE` (meson test `explain-quantize`).

usage: /usr/bin/python3 tests/golden/test_quantize_explain.py DMC SOURCE_ROOT (numpy: tests/ref/stio.py)

examples/mlp.dm with B=8,H=63 (an odd width: int4's last byte of a row half used; 784 rows,
so groups of 64 or 128 end short) for int8-weights, int4-weights:32, :64 and :128, and
int8 (int8 activations too: each weight has its product's input scale, 4 bytes more, and
the program no widening buffer but activation_buffer_bytes, the largest product's input in
int8 plus the largest int32 sums, B rows each):
  a) --explain=json's "quantized": the weights are fc1/fc2/fc3.weight, each with
     data bytes rows * cols (int8) or rows * ceil(cols / 2) (int4), scale bytes
     4 * ceil(rows / G) * cols (G = rows for int8), bytes_per_param their sum over rows * cols;
     param_bytes those plus 4 bytes per other parameter; param_bytes_f32 4 per parameter;
     widening_buffer_bytes the largest weight in f32; f32_peak_bytes the memory section's peak;
     program_bytes their sum with the narrow weights; the memory section a forward's alone
     (the program never trains): no gradients or optimizer state, the parameters it keeps
     in f32 (4 bytes each, at most 64 of alignment per tensor: int8 every one, for its
     calibration; int8-weights and int4 only the biases, each weight's f32_copy false), and a peak at most the f32
     training program's less its gradients and optimizer state (but the 64 bytes each of
     their empty buffers);
  b) the text --explain prints the section with those numbers, and says that the memory
     table's peak is the f32 program's tracked buffers (`dmc run --memory`'s model peak)
     without the narrow weights and buffers, and how much those are;
  c) int8-weights, int4-weights:128 and int8 (calibrated on 16 Fashion-MNIST rows): the
     file --save-quantized writes (from random f32 weights) holds, minus its header, exactly
     param_bytes, and each NAME, NAME.scale (and NAME.input_scale) tensor exactly the
     weight's data and scale bytes; and `--evaluate --memory` from that file measures the
     model peak f32_peak_bytes, to the byte;
  d) examples/gpt.dm (small dims), int8-weights: the weights --explain sizes are those the
     generated program quantizes (its dmrt_qweight_init calls, in order, with their shapes);
  e) a weight that a penalty in the loss also reads keeps its f32 copy (f32_copy true, its
     4 bytes a parameter in the memory section), the other weight none.
Exit status: 0 pass, 1 failure.
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402

SETS = "B=8,H=63"
LAYERS = (("fc1", 784, 63), ("fc2", 63, 63), ("fc3", 63, 10))
GPT_SETS = "V=256,T=16,C=32,NH=2,L=2,B=2"


class Failure(Exception):
    pass


def run(cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=240)
    if r.returncode != 0:
        raise Failure("%s: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    return r.stdout


def explain_json(dmc, src, sets, args):
    return json.loads(run([dmc, src, "--set", sets, "--explain=json"] + args))


def expected_weight(mode, rows, cols):
    bits, group = (8, rows) if mode in ("int8-weights", "int8") else (4, int(mode.split(":")[1]))
    data = rows * cols if bits == 8 else rows * ((cols + 1) // 2)
    scale = 4 * math.ceil(rows / group) * cols + (4 if mode == "int8" else 0)
    return {"rows": rows, "cols": cols, "group": group, "data_bytes": data, "scale_bytes": scale,
            "bytes_per_param": (data + scale) / (rows * cols)}


def check_forward_memory(mode, mem, train_mem, f32):
    """a)'s memory section: a forward's, without the training state; f32 the bytes of the
    parameters it keeps in f32"""
    if mem["grads"] != 0 or mem["optimizer_state"] != 0:
        raise Failure("%s: a program that never trains plans %d bytes of gradients and %d of optimizer state" %
                      (mode, mem["grads"], mem["optimizer_state"]))
    if not f32 <= mem["params"] <= f32 + 64 * 2 * len(LAYERS):
        raise Failure("%s: %d bytes of parameters, the f32 parameters it keeps are %d" % (mode, mem["params"], f32))
    training_state = train_mem["grads"] + train_mem["optimizer_state"]
    # + 128: the empty gradient and optimizer buffers still take one 64-byte unit each
    if mem["peak_bytes_per_rank"] > train_mem["peak_bytes_per_rank"] - training_state + 128:
        raise Failure("%s: peak %d, over the f32 training program's %d less its gradients and optimizer state %d" %
                      (mode, mem["peak_bytes_per_rank"], train_mem["peak_bytes_per_rank"], training_state))


def check_json(dmc, src, mode, train_mem):
    """a): returns the "quantized" object."""
    j = explain_json(dmc, src, SETS, ["--quantize", mode])
    f32_peak = j["memory_bytes_per_rank"]["peak_bytes_per_rank"]
    q = j.get("quantized")
    if not q or q["mode"] != mode:
        raise Failure("%s: no \"quantized\" of that mode in --explain=json: %s" % (mode, q))
    names = [w["name"] for w in q["weights"]]
    if names != [layer + ".weight" for layer, _, _ in LAYERS]:
        raise Failure("%s: weights %s" % (mode, names))
    narrow = widest = 0
    for w, (layer, rows, cols) in zip(q["weights"], LAYERS):
        want = expected_weight(mode, rows, cols)
        for key, value in want.items():
            if abs(w[key] - value) > 1e-12 * max(1, value):
                raise Failure("%s %s: %s %s, the formula %s" % (mode, w["name"], key, w[key], value))
        narrow += want["data_bytes"] + want["scale_bytes"]
        widest = max(widest, 4 * rows * cols)
    biases = 4 * sum(cols for _, _, cols in LAYERS)
    f32 = 4 * sum(rows * cols + cols for _, rows, cols in LAYERS)
    batch = int(SETS.split("B=")[1].split(",")[0])
    act = 0
    if mode == "int8":  # no widening: the largest input in int8 and the largest int32 sums
        widest = 0
        act = batch * max(rows for _, rows, _ in LAYERS) + 4 * batch * max(cols for _, _, cols in LAYERS)
    want = {"narrow_bytes": narrow, "param_bytes": narrow + biases, "param_bytes_f32": f32,
            "widening_buffer_bytes": widest, "activation_buffer_bytes": act, "f32_peak_bytes": f32_peak,
            "program_bytes": f32_peak + narrow + widest + act}
    for key, value in want.items():
        if q[key] != value:
            raise Failure("%s: %s %s, expected %s" % (mode, key, q[key], value))
    # int8-weights and int4 keep no f32 copy of a weight only its products read (all three
    # here): the biases alone are f32; int8's calibration multiplies the f32 weights
    copies = [w["f32_copy"] for w in q["weights"]]
    if copies != [mode == "int8"] * len(LAYERS):
        raise Failure("%s: f32 copies of the weights %s" % (mode, copies))
    check_forward_memory(mode, j["memory_bytes_per_rank"], train_mem, f32 if mode == "int8" else biases)
    return q


def check_text(dmc, src, mode, q):
    """b)"""
    text = run([dmc, src, "--set", SETS, "--explain", "--quantize", mode])
    fc2 = q["weights"][1]
    wants = ["quantized (--quantize %s): 3 weights stored %s" % (mode, "in int8" if mode == "int8" else "narrow"),
             "parameters: %d bytes quantized (the --save-quantized file's tensors) vs %d bytes f32" %
             (q["param_bytes"], q["param_bytes_f32"]),
             "%.4f bytes/param (%s + 4 / %d rows%s)  %d bytes" %
             (fc2["bytes_per_param"], "1" if mode.startswith("int8") else "0.5", fc2["group"],
              " + its input scale" if mode == "int8" else "", fc2["data_bytes"] + fc2["scale_bytes"]),
             # which number is what: the memory table's peak is the f32 parameters and the forward's
             # tracked buffers (`dmc run --memory`'s model peak); the narrow weights and buffers are apart
             "peak: the f32 parameters and the forward's buffers, tracked (`dmc run --memory`'s model peak), not "
             "the narrow weights (below)",
             "are the tracked %.2f MiB alone: the %.2f MiB of narrow weights and buffers are allocated untracked"
             % (q["f32_peak_bytes"] / 2**20, (q["program_bytes"] - q["f32_peak_bytes"]) / 2**20),
             # the predicted step is a forward, and says so
             "forward of 1 micro-batch on 1 stage:",
             "(--quantize: this program predicts and evaluates only, so the step above is one forward of the"]
    if "update:" in text or "forward and backward" in text:
        raise Failure("%s: --explain prices a backward or an update of a program that never trains:\n%s" % (mode, text))
    for want in wants:
        if want not in text:
            raise Failure("%s: --explain lacks '%s':\n%s" % (mode, want, text))


def write_f32(path):
    """random f32 weights of mlp.dm at SETS, as a safetensors file"""
    rng = np.random.default_rng(0)
    tensors = {}
    for layer, rows, cols in LAYERS:
        tensors[layer + ".weight"] = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        tensors[layer + ".bias"] = (rng.standard_normal(cols) * 0.1).astype(np.float32)
    stio.save(tensors, path)


def check_file(dmc, src, mode, q, d):
    """c)"""
    path = os.path.join(d, "q.st")
    calibrate = ["--calibrate", "16"] if mode == "int8" else []
    run([dmc, "run", src, "--set", SETS, "--quantize", mode, "--", "--init", "w.st", "--save-quantized", path,
         "--quiet"] + calibrate, cwd=d)
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    if len(blob) - 8 - n != q["param_bytes"]:
        raise Failure("%s: the --save-quantized file holds %d bytes of tensors, --explain says %d" %
                      (mode, len(blob) - 8 - n, q["param_bytes"]))

    def span(name):
        begin, end = header[name]["data_offsets"]
        return end - begin

    for w in q["weights"]:
        scales = span(w["name"] + ".scale") + (span(w["name"] + ".input_scale") if mode == "int8" else 0)
        if span(w["name"]) != w["data_bytes"] or scales != w["scale_bytes"]:
            raise Failure("%s %s: the file's tensors %d and %d bytes, --explain's %d and %d" %
                          (mode, w["name"], span(w["name"]), scales, w["data_bytes"], w["scale_bytes"]))
    # the runtime's tracked allocator, measured: the forward's plan, to the byte
    r = subprocess.run([dmc, "run", src, "--set", SETS, "--quantize", mode, "--", "--init", path, "--evaluate",
                        "--memory", "--quiet"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=240)
    measured = re.findall(r"memory rank 0: model peak (\d+) bytes", r.stderr)
    if r.returncode != 0 or measured != [str(q["f32_peak_bytes"])]:
        raise Failure("%s: --evaluate --memory: exit %d, model peak %s, --explain's %d\n%s" %
                      (mode, r.returncode, measured, q["f32_peak_bytes"], r.stderr))


def check_gpt(dmc, root, d):
    """d)"""
    src = os.path.join(root, "examples", "gpt.dm")
    q = explain_json(dmc, src, GPT_SETS, ["--quantize", "int8-weights"])["quantized"]
    out = os.path.join(d, "gpt")
    run([dmc, src, "--set", GPT_SETS, "--quantize", "int8-weights", "-o", out])
    code = open(os.path.join(out, "gpt.c")).read()
    made = [(int(r), int(c)) for r, c in re.findall(r"dmrt_qweight_init\(&ctx->quant\[\d+\], 8, (\d+), (\d+),", code)]
    sized = [(w["rows"], w["cols"]) for w in q["weights"]]
    if not made or made != sized:
        raise Failure("gpt.dm: --explain sizes %s, the program quantizes %s" % (sized, made))
    return len(made)


PENALTY = """dim B = 8
dim D = 16
dim H = 32
dim K = 4
input x : f32[B, D]
input y : i32[B]
param w1 : f32[D, H] = xavier
param w2 : f32[H, K] = xavier
logits = relu(x @ w1) @ w2
output logits
loss = cross_entropy(logits, y) + 0.001 * sum(w2 * w2)
minimize loss
optimizer sgd(lr = 0.1)
"""


def check_penalty(dmc, d):
    """e)"""
    src = os.path.join(d, "penalty.dm")
    with open(src, "w") as f:
        f.write(PENALTY)
    j = json.loads(run([dmc, src, "--explain=json", "--quantize", "int8-weights"]))
    copies = [(w["name"], w["f32_copy"]) for w in j["quantized"]["weights"]]
    if copies != [("w1", False), ("w2", True)]:
        raise Failure("penalty.dm: f32 copies %s, want w1 none and w2 one (the penalty reads it)" % copies)
    if j["memory_bytes_per_rank"]["params"] != 4 * 32 * 4:
        raise Failure("penalty.dm: %d bytes of f32 parameters, want w2's %d" % (j["memory_bytes_per_rank"]["params"], 512))


def main(argv):
    if len(argv) != 3:
        print("usage: test_quantize_explain.py DMC SOURCE_ROOT", file=sys.stderr)
        return 2
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    src = os.path.join(root, "examples", "mlp.dm")
    try:
        f32 = explain_json(dmc, src, SETS, [])
        if "quantized" in f32:
            raise Failure("an f32 program's --explain=json has \"quantized\"")
        with tempfile.TemporaryDirectory() as d:
            write_f32(os.path.join(d, "w.st"))
            for mode in ("int8-weights", "int4-weights:32", "int4-weights:64", "int4-weights:128", "int8"):
                q = check_json(dmc, src, mode, f32["memory_bytes_per_rank"])
                check_text(dmc, src, mode, q)
                if mode in ("int8-weights", "int4-weights:128", "int8"):
                    check_file(dmc, src, mode, q, d)
            n_gpt = check_gpt(dmc, root, d)
            check_penalty(dmc, d)
    except (Failure, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        print("FAIL: %s" % e)
        return 1
    print("PASS: --explain's quantized sizes equal the formula for int8(-weights) and int4 groups of 32/64/128 and the "
          "--save-quantized files' tensors; gpt.dm's %d sized weights are the program's" % n_gpt)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
