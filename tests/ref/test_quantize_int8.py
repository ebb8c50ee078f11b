#!/usr/bin/python3
"""test_quantize_int8.py: `dmc --quantize int8` (meson test `ref-quantize-int8-pytorch`).

usage: /usr/bin/python3 tests/ref/test_quantize_int8.py DMC SOURCE_ROOT

examples/mlp.dm with small dims (--set B=8,H=63) and random f32 weights, calibrated on a
small Fashion-MNIST-format directory written here (150 training rows of random pixels,
--data-dir), with --calibrate 100 (12 batches of 8 and one of 4 real rows and 4 padding).
Each program (int8, int8-weights, f32) is compiled once and run directly:

  a) the input scales --save-quantized writes (NAME.input_scale) against a torch f32
     forward of the same 100 rows: min-max, scale = max|x| / 127, and --calibrate-percentile
     99, scale = numpy.percentile(|x|, 99, method='lower') / 127. fc1's input (the
     standardised pixels, no product before it) bit for bit; fc2's and fc3's within 1e-5
     relative, as their inputs come out of f32 products whose sums the two libraries order
     differently. The I8 weights and their scales equal torch.quantize_per_channel's;
  b) --predict's logits (21 rows: calls of 8, 8, 5) with --init of the saved file, bit for
     bit, against a fake-quantized torch forward with the file's scales and integers:
     q_x = clamp(round(x / s_x), -127, 127) (torch.round: half to even), acc = q_x @ q_w in
     int32 (torch's integer matmul), logits = acc.float() * (s_x * s_w) + bias, relu between;
     the same bits from --init of the f32 file (calibrated again), and with the products
     forced onto plain C (DMRT_INT8_GEMM=c) and onto oneDNN where it can run; the logits
     are far from the f32 model's. (The int32 sums themselves are compared element by
     element in runtime-gemm-int8; here they are compared through the logits.)
  c) --evaluate prints a test accuracy from the f32 file and from the saved one, the same;
  e) a language model: examples/gpt.dm (V=256, T=16, C=32, NH=4, L=2, B=4) with
     gpt_torch.make_init's weights, calibrated on --data text (a corpus written here) with
     --calibrate 18 (4 batches of 4 windows and one of 2 real and 2 padding; window k the
     T+1 bytes from k T): each saved input scale against gpt_torch.forward's product inputs
     over the same 18 windows (max |x| / 127, within 1e-5 relative: f32 products and norms
     summed in other orders), every product the forward reads a 2-D weight with checked;
     and --predict from the f32 file with --data text (the message without it says to give
     it) predicts the bits of --init of the saved file;
  f) the C API (quant_int8_api.c, the kept mlp.c compiled with libdmrt): a forward before
     weights are loaded is refused (not aborted), mlp_load_weights refuses the f32 file and
     loads the saved one, two contexts from different seeds then predicting the same bits;
  d) failures, each a clear message and nothing written: --calibrate 0 and -5, a percentile
     of 0, 101 and 'x', --calibrate past the data's rows, --calibrate with a file that holds
     the scales, --calibrate for an f32 program, an int8 file for int8-weights and the
     reverse, an input scale of 0 in the file, f32 weights whose forward overflows on the
     calibration rows (an infinite |x|: named, for --save-quantized and --predict alike);
     and --quantize int8 --target cuda passes --check.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import gzip
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmcrun  # noqa: E402
import stio  # noqa: E402
from test_quantize import LAYERS, int8_reference, random_model  # noqa: E402

ROWS = 100
SETS = "B=8,H=63"


def build(dmc, src, d, dmc_args, name):
    """Compiles mlp.dm (SETS, dmc_args) once, into d/name/mlp, which the checks then run (a
    dmc run per check would compile it again). The run itself has no data and fails: only
    the program is wanted."""
    keep = os.path.join(d, name)
    cmd = [dmc, "run", src, "--set", SETS] + dmc_args + ["--keep", keep, "--", "--steps", "0", "--batch-file", "none.st"]
    subprocess.run(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    if not os.path.exists(os.path.join(keep, "mlp")):
        raise dmcrun.Failure("%s built no program" % " ".join(cmd))
    return os.path.join(keep, "mlp")


def run(prog, args, cwd, expect=0, env=None):
    """Runs a built program; its stdout and stderr when it exits with expect."""
    r = subprocess.run([prog] + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300, env=dict(os.environ, **(env or {})))
    if r.returncode != expect:
        raise dmcrun.Failure("%s %s: exit %d, expected %d\n%s" % (prog, " ".join(args), r.returncode, expect, r.stderr))
    return r.stdout + r.stderr


def expect_error(prog, args, cwd, want, expect=1):
    out = run(prog, args, cwd, expect)
    if want not in out:
        raise dmcrun.Failure("expected '%s' in: %s" % (want, out))


def write_idx(path, magic, array):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", n) for n in array.shape) + array.tobytes())


def write_fashion_mnist(np, d, train, test):
    rng = np.random.default_rng(1)
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(os.path.join(d, prefix + "-images-idx3-ubyte.gz"), 2051, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(os.path.join(d, prefix + "-labels-idx1-ubyte.gz"), 2049, rng.integers(0, 10, n, dtype=np.uint8))
    with gzip.open(os.path.join(d, "train-images-idx3-ubyte.gz")) as f:
        pixels = np.frombuffer(f.read()[16:], dtype=np.uint8).reshape(train, 784)
    return pixels.astype(np.float32) / np.float32(255)


def standardise(np, x):
    return (x - np.float32(0.2860)) / np.float32(0.3530)


def product_inputs(np, torch, w, x):
    """|x| of each product's left operand in the f32 forward: {layer: array}."""
    h = torch.from_numpy(standardise(np, x))
    seen = {}
    for layer in LAYERS:
        seen[layer] = h.abs().numpy().ravel()
        h = h @ torch.from_numpy(w[layer + ".weight"]) + torch.from_numpy(w[layer + ".bias"])
        if layer != LAYERS[-1]:
            h = torch.relu(h)
    return seen


def expected_scales(np, seen, percentile):
    out = {}
    for layer, v in seen.items():
        amax = v.max() if percentile is None else np.percentile(v, percentile, method="lower")
        out[layer] = np.float32(amax) / np.float32(127) if amax > 0 else np.float32(1)
    return out


def check_scales(np, torch, w, saved, want, how):
    for layer in LAYERS:
        got = saved[layer + ".weight.input_scale"]
        if got.shape != (1,) or got.dtype != np.float32:
            raise dmcrun.Failure("%s: %s.weight.input_scale is %s %s, not F32 [1]" % (how, layer, got.dtype, got.shape))
        ok = got[0] == want[layer] if layer == "fc1" else abs(got[0] - want[layer]) <= 1e-5 * want[layer]
        if not ok:
            raise dmcrun.Failure("%s: %s's input scale %.9g, torch's %.9g" % (how, layer, got[0], want[layer]))
        want_q, want_scale = int8_reference(torch, w[layer + ".weight"])
        if not np.array_equal(saved[layer + ".weight"], want_q) or not np.array_equal(saved[layer + ".weight.scale"], want_scale):
            raise dmcrun.Failure("%s: %s.weight's int8 values or scales differ from torch.quantize_per_channel's" % (how, layer))


def int8_forward(np, torch, saved, x):
    """The fake-quantized forward on the file's integers and scales."""
    h = torch.from_numpy(standardise(np, x))
    for layer in LAYERS:
        s_x = torch.tensor(saved[layer + ".weight.input_scale"][0])
        q_x = torch.clamp(torch.round(h / s_x), -127, 127).to(torch.int32)
        acc = q_x @ torch.from_numpy(saved[layer + ".weight"]).to(torch.int32)
        h = acc.to(torch.float32) * (s_x * torch.from_numpy(saved[layer + ".weight.scale"][0])) + \
            torch.from_numpy(saved[layer + ".bias"])
        if layer != LAYERS[-1]:
            h = torch.relu(h)
    return h.numpy()


def predict(prog, d, init, out, extra=(), env=None):
    run(prog, ["--init", init, "--predict", "--batch-file", "x.st", "--out", out, "--quiet"] + list(extra), d, env=env)
    return stio.load(os.path.join(d, out))["logits"]


def check_forward(prog, d, np, torch, w, x, saved, data):
    got = predict(prog, d, "q.st", "o.st")
    want = int8_forward(np, torch, saved, x)
    if not np.array_equal(got, want):
        raise dmcrun.Failure("int8 logits differ from the fake-quantized torch forward by up to %g"
                             % float(np.abs(got - want).max()))
    f32 = torch.relu(torch.from_numpy(standardise(np, x)) @ torch.from_numpy(w["fc1.weight"]) + torch.from_numpy(w["fc1.bias"]))
    f32 = torch.relu(f32 @ torch.from_numpy(w["fc2.weight"]) + torch.from_numpy(w["fc2.bias"]))
    f32 = (f32 @ torch.from_numpy(w["fc3.weight"]) + torch.from_numpy(w["fc3.bias"])).numpy()
    if float(np.abs(got - f32).max()) < 1e-4:
        raise dmcrun.Failure("int8 logits as close to the f32 model's as float rounding: nothing was quantized")
    runs = [("--init of the f32 file", "w.st", ["--data-dir", data, "--calibrate", str(ROWS)], None),
            ("DMRT_INT8_GEMM=c", "q.st", [], {"DMRT_INT8_GEMM": "c"})]
    if "avx512_vnni" in open("/proc/cpuinfo").read():
        runs.append(("DMRT_INT8_GEMM=onednn", "q.st", [], {"DMRT_INT8_GEMM": "onednn"}))
    for what, init, extra, env in runs:
        if not np.array_equal(predict(prog, d, init, "o2.st", extra, env), got):
            raise dmcrun.Failure("%s predicts other logits than --init q.st" % what)
    return float(np.abs(got - f32).max())


def check_evaluate(prog, d, data):
    accs = []
    for init, extra in (("w.st", ["--data-dir", data, "--calibrate", str(ROWS)]), ("q.st", ["--data-dir", data])):
        lines = [line for line in run(prog, ["--evaluate", "--init", init] + extra, d).splitlines()
                 if line.startswith("test accuracy ")]
        if not lines:
            raise dmcrun.Failure("--evaluate --init %s printed no test accuracy" % init)
        accs.append(lines[-1])
    if accs[0] != accs[1]:
        raise dmcrun.Failure("--evaluate: %s from the f32 file, %s from the saved one" % (accs[0], accs[1]))


def check_failures(np, dmc, src, d, data, progs):
    i8, f32, i8w = progs["int8"], progs["f32"], progs["int8-weights"]
    cal = ["--init", "w.st", "--data-dir", data, "--save-quantized", "bad.st"]
    for value in ("0", "-5"):
        expect_error(i8, cal + ["--calibrate", value], d,
                     "bad value '%s' for --calibrate: expected a positive number of training rows" % value, expect=2)
    for value in ("0", "101", "x"):
        expect_error(i8, cal + ["--calibrate-percentile", value], d,
                     "bad value '%s' for --calibrate-percentile: expected a percentile P, 0 < P <= 100" % value, expect=2)
    expect_error(i8, cal + ["--calibrate", "151"], d, "--calibrate 151: %s has only 150 training rows" % data)
    expect_error(i8, ["--init", "q.st", "--calibrate", "10", "--save-quantized", "bad.st"], d,
                 "q.st holds calibrated input scales (--save-quantized wrote it): --calibrate and --calibrate-percentile "
                 "apply to f32 weights")
    expect_error(f32, ["--init", "w.st", "--calibrate", "10", "--evaluate"], d,
                 "--calibrate applies to a program compiled with --quantize int8 (model 'mlp' is an f32 program)", expect=2)
    expect_error(i8w, ["--init", "q.st", "--save-quantized", "bad.st"], d,
                 "q.st: weights quantized as --quantize int8, but this program is --quantize int8-weights")
    run(i8w, ["--init", "w.st", "--save-quantized", "q8w.st", "--quiet"], d)
    expect_error(i8, ["--init", "q8w.st", "--save-quantized", "bad.st"], d,
                 "q8w.st: weights quantized as --quantize int8-weights, but this program is --quantize int8")
    tampered = stio.load(os.path.join(d, "q.st"))
    tampered["fc2.weight.input_scale"][0] = 0.0
    stio.save(tampered, os.path.join(d, "zero.st"), metadata={"dmc.format": "dmc quantized 1", "dmc.model": "mlp",
                                                              "dmc.quantize": "int8"})
    expect_error(i8, ["--init", "zero.st", "--save-quantized", "bad.st"], d,
                 "zero.st: tensor 'fc2.weight.input_scale' is 0: an input scale must be positive and finite")
    # f32 weights whose forward overflows on the calibration rows: fc2's input is inf, which
    # would be an input scale of inf (a file its own loader refuses)
    huge = dict(stio.load(os.path.join(d, "w.st")))
    huge["fc1.weight"] = (np.sign(huge["fc1.weight"]) * np.float32(3e38)).astype(np.float32)
    stio.save(huge, os.path.join(d, "huge.st"))
    overflow = "calibration of 'fc2.weight': the input of its product holds an infinite value on the calibration rows"
    huge_cal = ["--init", "huge.st", "--data-dir", data, "--calibrate", str(ROWS)]
    expect_error(i8, huge_cal + ["--save-quantized", "bad.st"], d, overflow)
    expect_error(i8, huge_cal + ["--predict", "--batch-file", "x.st", "--out", "bad.st"], d, overflow)
    if os.path.exists(os.path.join(d, "bad.st")):
        raise dmcrun.Failure("a failed run wrote bad.st")
    r = subprocess.run([dmc, src, "--target", "cuda", "--quantize", "int8", "--check"], stderr=subprocess.PIPE,
                       universal_newlines=True)
    if r.returncode != 0:
        raise dmcrun.Failure("--target cuda --quantize int8 --check: exit %d, %s" % (r.returncode, r.stderr))


GPT_DIMS = {"V": 256, "T": 16, "C": 32, "NH": 4, "L": 2, "B": 4}
TEXT_ROWS = 18


def check_text_calibration(dmc, root, np, torch, d):
    """e): a byte-level GPT calibrated on text windows against gpt_torch's product inputs."""
    import gpt_torch as G
    V, T, C, NH, L, B = (GPT_DIMS[k] for k in ("V", "T", "C", "NH", "L", "B"))
    w = G.make_init(torch, G.param_specs(V, T, C, L), 11)
    stio.save(w, os.path.join(d, "gpt.st"))
    corpus = bytes(np.random.default_rng(5).integers(32, 127, 4000).astype(np.uint8))
    with open(os.path.join(d, "corpus.txt"), "wb") as f:
        f.write(corpus)
    sets = ",".join("%s=%d" % kv for kv in GPT_DIMS.items())
    cmd = [dmc, "run", os.path.join(root, "examples", "gpt.dm"), "--set", sets, "--quantize", "int8", "--keep", "kgpt",
           "--", "--init", "gpt.st", "--data", "text:corpus.txt", "--calibrate", str(TEXT_ROWS), "--save-quantized",
           "gq.st", "--quiet"]
    r = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    if r.returncode != 0:
        raise dmcrun.Failure("`%s` failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stdout))
    saved = stio.load(os.path.join(d, "gq.st"))
    windows = np.stack([np.frombuffer(corpus[k * T:k * T + T + 1], dtype=np.uint8) for k in range(TEXT_ROWS)])
    tokens, targets = torch.from_numpy(windows[:, :-1].astype(np.int64)), torch.from_numpy(windows[:, 1:].astype(np.int64))
    p = {n: torch.from_numpy(v) for n, v in w.items()}
    names = {id(t): n for n, t in p.items()}
    amax = {}

    def product(a, b):
        name = names.get(id(b))
        if name is not None:
            amax[name] = max(amax.get(name, 0.0), float(a.abs().max()))
        return a @ b
    with torch.no_grad():
        G.forward(torch, p, tokens, targets, NH, L, product)
    scales = {n[:-len(".input_scale")]: v for n, v in saved.items() if n.endswith(".input_scale")}
    if not scales or set(scales) - set(amax):
        raise dmcrun.Failure("gpt.dm int8: input scales for %s, torch's weight products %s" % (sorted(scales),
                                                                                             sorted(amax)))
    worst = 0.0
    for name, got in scales.items():
        want = np.float32(amax[name]) / np.float32(127)
        rel = abs(float(got[0]) - float(want)) / float(want)
        worst = max(worst, rel)
        if rel > 1e-5:
            raise dmcrun.Failure("gpt.dm int8: %s's input scale %.9g, torch's %.9g" % (name, got[0], want))
    print("gpt.dm int8 on text: %d input scales as torch's over %d windows (worst %.2g relative)"
          % (len(scales), TEXT_ROWS, worst))
    check_text_predict(np, d, os.path.join(d, "kgpt", "gpt"))
    return len(scales)


def check_text_predict(np, d, prog):
    """e) --predict of the int8 GPT from its f32 weights calibrates on --data text (as the
    message without it says to), predicting the bits of --init of the file calibrated alike."""
    tokens = np.random.default_rng(6).integers(0, GPT_DIMS["V"], (7, GPT_DIMS["T"])).astype(np.int32)
    stio.save({"tokens": tokens}, os.path.join(d, "tokens.st"))
    ask = ["--predict", "--batch-file", "tokens.st", "--quiet"]
    expect_error(prog, ["--init", "gpt.st", "--out", "none.st"] + ask, d, "(or --data text:FILES)")
    run(prog, ["--init", "gpt.st", "--data", "text:corpus.txt", "--calibrate", str(TEXT_ROWS), "--out", "calibrated.st"]
        + ask, d)
    run(prog, ["--init", "gq.st", "--out", "saved.st"] + ask, d)
    got, want = (stio.load(os.path.join(d, f))["logits"] for f in ("calibrated.st", "saved.st"))
    if not np.array_equal(got, want):
        raise dmcrun.Failure("gpt.dm int8 --predict --data text from the f32 weights: logits differ from --init of its "
                             "--save-quantized file by up to %g" % float(np.abs(got - want).max()))


def body(dmc, root, np, torch):
    src = os.path.join(root, "examples", "mlp.dm")
    w, x = random_model(np)
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "fmnist")
        os.mkdir(data)
        train = write_fashion_mnist(np, data, 150, 16)
        stio.save(w, os.path.join(d, "w.st"))
        stio.save({"x": x}, os.path.join(d, "x.st"))
        progs = {name: build(dmc, src, d, args, name)
                 for name, args in (("int8", ["--quantize", "int8"]), ("f32", []),
                                    ("int8-weights", ["--quantize", "int8-weights"]))}
        i8 = progs["int8"]
        seen = product_inputs(np, torch, w, train[:ROWS])
        cal = ["--init", "w.st", "--data-dir", data, "--calibrate", str(ROWS), "--quiet"]
        run(i8, cal + ["--calibrate-percentile", "99", "--save-quantized", "qp.st"], d)
        check_scales(np, torch, w, stio.load(os.path.join(d, "qp.st")), expected_scales(np, seen, 99), "percentile 99")
        run(i8, cal + ["--save-quantized", "q.st"], d)
        saved = stio.load(os.path.join(d, "q.st"))
        check_scales(np, torch, w, saved, expected_scales(np, seen, None), "min-max")
        far = check_forward(i8, d, np, torch, w, x, saved, data)
        check_evaluate(i8, d, data)
        check_failures(np, dmc, src, d, data, progs)
        if dmcrun.TARGET == "c":  # f) the C API of the int8 program, with q.st and w.st beside it
            dmcrun.c_api_probe(dmc, os.path.join(root, "tests", "ref", "quant_int8_api.c"),
                               os.path.join(d, "int8", "mlp.c"), os.path.join(d, "int8"), "C API, int8")
        n_gpt = check_text_calibration(dmc, root, np, torch, d)
    return ("input scales (min-max, percentile 99) as torch's over the 100 calibration rows; int8 logits bit for bit "
            "the fake-quantized torch forward's (oneDNN and plain C alike; %.3g from the f32 model's); "
            "bad options and files refused; gpt.dm's %d scales from text windows as torch's" % (far, n_gpt))


if __name__ == "__main__":
    sys.exit(dmcrun.reference_main(sys.argv, body))
