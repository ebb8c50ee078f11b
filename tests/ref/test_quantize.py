#!/usr/bin/python3
"""test_quantize.py: `dmc --quantize int8-weights | int4-weights` (meson test `ref-quantize-pytorch`).

usage: /usr/bin/python3 tests/ref/test_quantize.py DMC SOURCE_ROOT

examples/mlp.dm with small dims (--set B=8,H=63: an odd width, so int4's packing has a lone
last column) and random f32 weights:

  a) int8-weights: --save-quantized's I8 tensors equal torch.quantize_per_channel(w, scale,
     0, axis=1, torch.qint8).int_repr() with scale = max|w| / 127 per output column, and
     its scales are those, bit for bit;
  b) int4-weights:32: the U8 tensors unpacked (two per byte, low nibble first) equal the
     group-wise formula in torch (scale = max|w| / 7 over 32 rows of a column, the last
     group 784 mod 32 = 16 rows; q = clamp(round(w * (1 / scale)), -8, 7)), and the scales;
  c) --predict's logits (21 rows: calls of 8, 8, 5) with --init of the f32 file equal a
     PyTorch f32 forward on the dequantized weights (q * scale: fake quantization) within
     1e-5, and are far from the f32 model's (the weights are really narrow);
  d) --predict with --init of the --save-quantized file gives the same logits bit for bit;
  e) failures, each a clear message and nothing written: a file of another mode (naming
     both), of another model size (naming the tensor), a quantized file for the f32
     program, training a quantized program (exit 2), --save-quantized with a bad --init
     (no file left), --save-quantized with an option it would ignore (--resume, --steps,
     --save, --data, ...: exit 2, no file), a bad mode (--quantize int8 is
     test_quantize_int8.py's); and on the
     CUDA target, --quantize is built, and refused with a mesh by --check and -o alike;
  f) the C API (quant_api.c, the generated int8-weights and int4-weights mlp.c compiled
     with warnings as errors, under ASan and UBSan where available): train_step refused
     with its reason, changing nothing (forward's logits and the saved weights bit for bit
     the same after), forward and predict running;
  g) examples/llama.dm, whose weights W [out, in] are read x @ transpose(W): every one
     stored narrow as the product's [in, out] (W's transpose), int8 equal to
     torch.quantize_per_channel of W along its rows (axis 0) and int4:16 to the group-wise
     formula on W's transpose; its --predict logits equal the f32 llama program's with
     --init of the fake-quantized weights within 1e-5, and the --save-quantized file
     predicts them bit for bit;
  h) examples/gpt.dm likewise, its weights read x @ W: c_attn [C, 3C] stored narrow whole,
     its three products (q, k, v) each reading a window of C columns, equal to
     torch.quantize_per_channel and the group-wise formula on [C, 3C]; the tied wte and
     wpe stay f32; logits and the saved file as in g);
  i) --quantize-embeddings: gpt.dm's tied wte (int4:16) and llama.dm's embed_tokens (int8)
     narrow too, equal to torch.quantize_per_channel along the table's rows (axis 0) and the
     group-wise formula on its transpose; wpe stays f32; logits and the saved file as in g).

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmcrun  # noqa: E402
import stio  # noqa: E402
from mlp_torch import mlp_logits  # noqa: E402

SETS = "B=8,H=63"
LAYERS = ("fc1", "fc2", "fc3")


def dmc_run(dmc, src, dmc_args, trainer_args, cwd, expect=0, sets=SETS):
    cmd = [dmc, "run", src, "--set", sets] + dmc_args + ["--"] + trainer_args + ["--quiet"]
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    if r.returncode != expect:
        raise dmcrun.Failure("%s: exit %d, expected %d\n%s" % (" ".join(cmd), r.returncode, expect, r.stderr))
    return r.stderr


def int8_reference(torch, w):
    """(q int8, scale f32[1, cols]) of PyTorch's per-channel quantization, axis 1."""
    t = torch.from_numpy(w)
    amax = t.abs().amax(dim=0)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.quantize_per_channel(t, scale.double(), torch.zeros(t.shape[1], dtype=torch.long), 1, torch.qint8)
    return q.int_repr().numpy(), scale.numpy().reshape(1, -1)


def int4_reference(np, torch, w, group):
    """(q in [-8, 7] as int8, scale f32[groups, cols]): group-wise along the rows."""
    t = torch.from_numpy(w)
    rows, cols = t.shape
    groups = (rows + group - 1) // group
    scale = torch.empty(groups, cols)
    q = torch.empty(rows, cols, dtype=torch.int8)
    for g in range(groups):
        block = t[g * group:(g + 1) * group]
        amax = block.abs().amax(dim=0)
        s = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax))
        scale[g] = s
        q[g * group:(g + 1) * group] = torch.clamp(torch.round(block * (1.0 / s)), -8, 7).to(torch.int8)
    return q.numpy(), scale.numpy()


def unpack_int4(np, packed, cols):
    low = (packed & 15).astype(np.int16)
    high = (packed >> 4).astype(np.int16)
    both = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.int16)
    both[:, 0::2], both[:, 1::2] = low, high
    both = both[:, :cols]
    return np.where(both >= 8, both - 16, both).astype(np.int8)


def check_mode(dmc, src, d, np, torch, w, x, mode, reference):
    """a/b, c and d for one mode; returns the worst difference from the fake-quantized forward."""
    qfile = "q-%s.st" % mode.replace(":", "-")
    dmc_run(dmc, src, ["--quantize", mode], ["--init", "w.st", "--save-quantized", qfile], d)
    saved = stio.load(os.path.join(d, qfile))
    fake = dict(w)
    for layer in LAYERS:
        name = layer + ".weight"
        want_q, want_scale = reference(w[name])
        got_q = saved[name] if saved[name].dtype == np.int8 else unpack_int4(np, saved[name], w[name].shape[1])
        if not np.array_equal(got_q, want_q):
            bad = np.argwhere(got_q != want_q)[0]
            raise dmcrun.Failure("%s %s: q%s = %d, PyTorch's %d" % (mode, name, list(bad), got_q[tuple(bad)], want_q[tuple(bad)]))
        if not np.array_equal(saved[name + ".scale"], want_scale):
            raise dmcrun.Failure("%s %s.scale differs from PyTorch's" % (mode, name))
        group = w[name].shape[0] if want_scale.shape[0] == 1 else -(-w[name].shape[0] // want_scale.shape[0])
        fake[name] = (want_q.astype(np.float32) * np.repeat(want_scale, group, axis=0)[:w[name].shape[0]]).astype(np.float32)
    dmc_run(dmc, src, ["--quantize", mode], ["--init", "w.st", "--predict", "--batch-file", "x.st", "--out", "o.st"], d)
    got = stio.load(os.path.join(d, "o.st"))["logits"]
    want, f32 = mlp_logits(torch, fake, x), mlp_logits(torch, w, x)
    diff = float(np.abs(got - want).max())
    if diff > 1e-5 * max(1.0, float(np.abs(want).max())):
        raise dmcrun.Failure("%s: logits differ from the fake-quantized PyTorch forward by %g" % (mode, diff))
    if float(np.abs(got - f32).max()) < 100 * diff + 1e-6:
        raise dmcrun.Failure("%s: logits as close to the f32 model's as to the quantized one's" % mode)
    dmc_run(dmc, src, ["--quantize", mode], ["--init", qfile, "--predict", "--batch-file", "x.st", "--out", "o2.st"], d)
    if not np.array_equal(stio.load(os.path.join(d, "o2.st"))["logits"], got):
        raise dmcrun.Failure("%s: --init of the --save-quantized file predicts other logits" % mode)
    return diff


def expect_error(dmc, src, d, dmc_args, trainer_args, want, expect=1, sets=SETS):
    err = dmc_run(dmc, src, dmc_args, trainer_args, d, expect=expect, sets=sets)
    if want not in err:
        raise dmcrun.Failure("expected '%s' in: %s" % (want, err))


# what --save-quantized, which writes the weights and exits, refuses beside it (exit 2): each
# would be ignored (--resume's checkpoint: the initial weights would be written, not its)
SAVE_QUANTIZED_REFUSES = (["--resume", "ck"], ["--steps", "1"], ["--epochs", "1"], ["--save", "s.st"],
                          ["--checkpoint", "ckd"], ["--dump-grads", "g.st"], ["--trace", "t.json"], ["--sample", "4"],
                          ["--eval-every", "2"], ["--batch-file", "x.st"], ["--data", "fashion-mnist"],
                          ["--data-dir", "."], ["--predict"], ["--evaluate"], ["--memory"])


def check_save_quantized_alone(dmc, src, d):
    """e) --save-quantized with an option it would ignore: a usage error naming it, no file."""
    keep = os.path.join(d, "keep-i8w")
    dmc_run(dmc, src, ["--quantize", "int8-weights", "--keep", keep], ["--init", "w.st", "--save-quantized", "k.st"], d)
    for extra in SAVE_QUANTIZED_REFUSES:
        weights = [] if extra[0] == "--resume" else ["--init", "w.st"]  # (--resume with --init: its own error)
        cmd = [os.path.join(keep, "mlp"), "--save-quantized", "alone.st", "--quiet"] + weights + extra
        r = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
        want = "--save-quantized writes the weights and exits: it cannot be combined with " + extra[0]
        if r.returncode != 2 or want not in r.stderr:
            raise dmcrun.Failure("%s: exit %d, expected 2 and '%s'\n%s" % (" ".join(cmd), r.returncode, want, r.stderr))
        if os.path.exists(os.path.join(d, "alone.st")):
            raise dmcrun.Failure("%s wrote alone.st" % " ".join(cmd))


def check_failures(dmc, src, d):
    check_save_quantized_alone(dmc, src, d)
    i4 = ["--quantize", "int4-weights:32"]
    expect_error(dmc, src, d, i4, ["--init", "q-int8-weights.st", "--predict", "--batch-file", "x.st", "--out", "bad.st"],
                 "q-int8-weights.st: weights quantized as --quantize int8-weights, but this program is --quantize int4-weights:32")
    expect_error(dmc, src, d, ["--quantize", "int8-weights"], ["--init", "q-int8-weights.st", "--save-quantized", "bad.st"],
                 "tensor 'fc1.weight': shape [784, 63] in the file but the model expects [784, 64]", sets="B=8,H=64")
    expect_error(dmc, src, d, [], ["--init", "q-int8-weights.st", "--predict", "--batch-file", "x.st", "--out", "bad.st"],
                 "holds quantized weights (--quantize int8-weights); model 'mlp' is an f32 program")
    expect_error(dmc, src, d, i4, ["--init", "missing.st", "--save-quantized", "bad.st"], "missing.st")
    expect_error(dmc, src, d, i4, ["--init", "w.st", "--steps", "1"], "is a quantized inference program (--quantize "
                 "int4-weights:32): it cannot train", expect=2)
    # a non-finite f32 tensor of a quantized file (a bias, a weight's scale) is refused as
    # --init's f32 files' are, naming the file and the tensor (it was loaded and predicted);
    # the file keeps the other tensors' CRC-32Cs (dmc.crc32c.<name>), not the changed one's,
    # whose check would refuse it first
    saved, meta = stio.load(os.path.join(d, "q-int8-weights.st")), stio.load_metadata(os.path.join(d, "q-int8-weights.st"))
    for tensor, value in (("fc1.bias", float("nan")), ("fc2.weight.scale", float("inf"))):
        q = dict(saved)
        q[tensor] = saved[tensor].copy()
        q[tensor].flat[0] = value
        stio.save(q, os.path.join(d, "nonfinite.st"),
                  metadata={k: v for k, v in meta.items() if k != "dmc.crc32c." + tensor})
        expect_error(dmc, src, d, ["--quantize", "int8-weights"],
                     ["--init", "nonfinite.st", "--predict", "--batch-file", "x.st", "--out", "bad.st"],
                     "nonfinite.st: tensor '%s' (quantized tensor '%s') holds a non-finite value: %s at element 0"
                     % (tensor, tensor, "nan" if value != value else "inf"))
    if os.path.exists(os.path.join(d, "bad.st")):
        raise dmcrun.Failure("a failed run wrote bad.st")
    # the CUDA target builds it (tests/gpu: cuda-build compiles it, gpu-quantize-* run it);
    # with a mesh both targets refuse it, --check and -o alike
    for args in (["--check"], ["-o", os.path.join(d, "cuda")]):
        r = subprocess.run([dmc, src, "--target", "cuda", "--quantize", "int8-weights"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        if r.returncode != 0:
            raise dmcrun.Failure("--target cuda --quantize %s: exit %d, %s" % (args[0], r.returncode, r.stderr))
        r = subprocess.run([dmc, src, "--target", "cuda", "--quantize", "int8-weights", "--mesh", "data=2"] +
                           [a + "-mesh" if a.endswith("cuda") else a for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        if r.returncode == 0 or "--quantize makes serial inference programs" not in r.stderr:
            raise dmcrun.Failure("--target cuda --quantize --mesh data=2 %s: exit %d, %s" % (args[0], r.returncode, r.stderr))
    with open(os.path.join(d, "cuda", "mlp.cu")) as f:
        if "dmrt_gpu_gemm_wq(" not in f.read():
            raise dmcrun.Failure("-o --target cuda --quantize int8-weights: mlp.cu calls no dmrt_gpu_gemm_wq")
    if os.path.exists(os.path.join(d, "cuda-mesh", "mlp.cu")):
        raise dmcrun.Failure("-o wrote the CUDA program it refused")
    for mode, want in (("int3", "--quantize takes int8, int8-weights or int4-weights[:G], got 'int3'"),):
        r = subprocess.run([dmc, src, "--check", "--quantize", mode], stderr=subprocess.PIPE, universal_newlines=True)
        if r.returncode == 0 or want not in r.stderr:
            raise dmcrun.Failure("--quantize %s: exit %d, %s" % (mode, r.returncode, r.stderr))


def random_model(np, h=63):
    """mlp.dm's weights (--set H=h) and 21 rows of inputs, random (test_quantize_int8.py's too)."""
    rng = np.random.default_rng(0)
    w = {"fc1.weight": (rng.standard_normal((784, h)) * 0.05).astype(np.float32),
         "fc2.weight": (rng.standard_normal((h, h)) * 0.1).astype(np.float32),
         "fc3.weight": (rng.standard_normal((h, 10)) * 0.1).astype(np.float32)}
    for layer, n in (("fc1", h), ("fc2", h), ("fc3", 10)):
        w[layer + ".bias"] = (rng.standard_normal(n) * 0.1).astype(np.float32)
    return w, rng.random((21, 784), dtype=np.float32)


def check_api(dmc, root, d):
    """f) tests/ref/quant_api.c against the int8-weights and int4-weights mlp.c (B=8, H=63)."""
    if dmcrun.TARGET != "c":
        return
    for mode in ("int8-weights", "int4-weights:32"):
        out = os.path.join(d, "api-" + mode.replace(":", "-"))
        os.makedirs(out, exist_ok=True)
        subprocess.run([dmc, os.path.join(root, "examples", "mlp.dm"), "--set", SETS, "--quantize", mode, "-o", out],
                       check=True)
        dmcrun.c_api_probe(dmc, os.path.join(root, "tests", "ref", "quant_api.c"), os.path.join(out, "mlp.c"), out,
                           "C API, " + mode)


LLAMA_SETS = "V=64,T=8,C=32,NH=4,NKV=2,F=48,L=2,B=3"
LLAMA_WEIGHTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj")


GPT_SETS = "V=64,T=8,C=32,NH=4,L=2,B=3"
GPT_WEIGHTS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


MODES = (("int8-weights", lambda np, torch, v: int8_reference(torch, v)),
         ("int4-weights:16", lambda np, torch, v: int4_reference(np, torch, v, 16)))


def check_language_model(dmc, src, d, np, torch, sets, names, transposed, f32_names, label, extra=(), modes=MODES):
    """g, h, i: a language model's weights quantized (names; transposed: those of them read
    x @ transpose(W), or an embedding's table, stored as W's transpose: True for all, or a
    set of names) and its --predict logits against the f32 program's on the fake-quantized
    weights; f32_names stay f32 in the --save-quantized file. extra: more dmc options."""
    if transposed is True or transposed is False:
        transposed = set(names) if transposed else set()
    rng = np.random.default_rng(3)
    stio.save({"tokens": rng.integers(0, 64, (1, 3, 8)).astype(np.int32),
               "targets": rng.integers(0, 64, (1, 3, 8)).astype(np.int32)}, os.path.join(d, "lb.st"))
    dmc_run(dmc, src, [], ["--batch-file", "lb.st", "--steps", "0", "--save", "lw.st"], d, sets=sets)
    w = stio.load(os.path.join(d, "lw.st"))
    stio.save({"tokens": rng.integers(0, 64, (7, 8)).astype(np.int32)}, os.path.join(d, "lt.st"))
    dmc_run(dmc, src, [], ["--init", "lw.st", "--predict", "--batch-file", "lt.st", "--out", "lof.st"], d, sets=sets)
    f32 = stio.load(os.path.join(d, "lof.st"))["logits"]
    worst = 0.0
    for mode, reference in modes:
        tag = mode.replace(":", "-")
        quantize = ["--quantize", mode] + list(extra)
        dmc_run(dmc, src, quantize, ["--init", "lw.st", "--save-quantized", "lq-%s.st" % tag], d, sets=sets)
        saved = stio.load(os.path.join(d, "lq-%s.st" % tag))
        for name in f32_names:
            if saved[name].dtype != np.float32 or not np.array_equal(saved[name], w[name]):
                raise dmcrun.Failure("%s %s: %s is not kept f32" % (label, mode, name))
        fake = dict(w)
        for name in names:
            flip = name in transposed
            wt = np.ascontiguousarray(w[name].T if flip else w[name])  # the product's [in, out]
            want_q, want_scale = reference(np, torch, wt)
            got_q = saved[name] if saved[name].dtype == np.int8 else unpack_int4(np, saved[name], wt.shape[1])
            if got_q.shape != want_q.shape or not np.array_equal(got_q, want_q):
                raise dmcrun.Failure("%s %s %s: narrow %s differs from PyTorch's on %s %s"
                                     % (label, mode, name, got_q.shape, "W's transpose" if flip else "W",
                                        want_q.shape))
            if not np.array_equal(saved[name + ".scale"], want_scale):
                raise dmcrun.Failure("%s %s %s.scale differs from PyTorch's" % (label, mode, name))
            group = wt.shape[0] if want_scale.shape[0] == 1 else -(-wt.shape[0] // want_scale.shape[0])
            deq = (want_q.astype(np.float32) * np.repeat(want_scale, group, axis=0)[:wt.shape[0]]).astype(np.float32)
            fake[name] = np.ascontiguousarray(deq.T if flip else deq)
        stio.save(fake, os.path.join(d, "lfake.st"))
        dmc_run(dmc, src, [], ["--init", "lfake.st", "--predict", "--batch-file", "lt.st", "--out", "lo32.st"], d,
                sets=sets)
        dmc_run(dmc, src, quantize, ["--init", "lw.st", "--predict", "--batch-file", "lt.st", "--out", "loq.st"],
                d, sets=sets)
        want = stio.load(os.path.join(d, "lo32.st"))["logits"]
        got = stio.load(os.path.join(d, "loq.st"))["logits"]
        diff = float(np.abs(got - want).max())
        if diff > 1e-5 * max(1.0, float(np.abs(want).max())):
            raise dmcrun.Failure("%s %s: logits differ from the f32 program's on the fake-quantized weights by %g"
                                 % (label, mode, diff))
        if float(np.abs(got - f32).max()) < 100 * diff + 1e-6:
            raise dmcrun.Failure("%s %s: logits as close to the f32 weights' as to the quantized ones'" % (label, mode))
        dmc_run(dmc, src, quantize, ["--init", "lq-%s.st" % tag, "--predict", "--batch-file", "lt.st", "--out",
                                     "loq2.st"], d, sets=sets)
        if not np.array_equal(stio.load(os.path.join(d, "loq2.st"))["logits"], got):
            raise dmcrun.Failure("%s %s: --init of the --save-quantized file predicts other logits" % (label, mode))
        worst = max(worst, diff)
    return worst


def check_llama(dmc, root, d, np, torch):
    """g: llama.dm's weights, read x @ transpose(W), quantized as W's transpose."""
    names = ["model.layers.%d.%s.weight" % (l, k) for l in range(2) for k in LLAMA_WEIGHTS] + ["lm_head.weight"]
    return check_language_model(dmc, os.path.join(root, "examples", "llama.dm"), d, np, torch, LLAMA_SETS, names, True,
                                ["model.embed_tokens.weight"], "llama")


def check_gpt(dmc, root, d, np, torch):
    """h: gpt.dm's weights, c_attn's three column windows included; the tied wte and wpe f32."""
    names = ["h.%d.%s.weight" % (l, k) for l in range(2) for k in GPT_WEIGHTS]
    return check_language_model(dmc, os.path.join(root, "examples", "gpt.dm"), d, np, torch, GPT_SETS, names, False,
                                ["wte.weight", "wpe.weight"], "gpt")


def check_embeddings(dmc, root, d, np, torch):
    """i: --quantize-embeddings: gpt.dm's tied wte (its embedding and its head) and llama.dm's
    embed_tokens (an embedding alone) narrow too, a scale per row (stored as the table's
    transpose); wpe stays f32 (added, not gathered). int4 groups of 16 of gpt's C, int8 for
    llama, each once."""
    gpt = ["h.%d.%s.weight" % (l, k) for l in range(2) for k in GPT_WEIGHTS] + ["wte.weight"]
    worst = check_language_model(dmc, os.path.join(root, "examples", "gpt.dm"), d, np, torch, GPT_SETS, gpt,
                                 {"wte.weight"}, ["wpe.weight"], "gpt --quantize-embeddings", ["--quantize-embeddings"],
                                 MODES[1:])
    llama = (["model.layers.%d.%s.weight" % (l, k) for l in range(2) for k in LLAMA_WEIGHTS] +
             ["lm_head.weight", "model.embed_tokens.weight"])
    return max(worst, check_language_model(dmc, os.path.join(root, "examples", "llama.dm"), d, np, torch, LLAMA_SETS,
                                           llama, True, [], "llama --quantize-embeddings", ["--quantize-embeddings"],
                                           MODES[:1]))


def body(dmc, root, np, torch):
    src = os.path.join(root, "examples", "mlp.dm")
    w, x = random_model(np)
    w["fc2.weight"][:, 5] = 0.0  # a zero column: scale 1, q 0
    with tempfile.TemporaryDirectory() as d:
        stio.save(w, os.path.join(d, "w.st"))
        stio.save({"x": x}, os.path.join(d, "x.st"))
        d8 = check_mode(dmc, src, d, np, torch, w, x, "int8-weights", lambda v: int8_reference(torch, v))
        d4 = check_mode(dmc, src, d, np, torch, w, x, "int4-weights:32", lambda v: int4_reference(np, torch, v, 32))
        check_failures(dmc, src, d)
        check_api(dmc, root, d)
        dl = check_llama(dmc, root, d, np, torch)
        dg = check_gpt(dmc, root, d, np, torch)
        de = check_embeddings(dmc, root, d, np, torch)
    return ("int8 per channel and int4 groups of 32 equal PyTorch's; logits within %.1e / %.1e of the fake-quantized "
            "forward; saved files reload bit for bit; bad files and modes refused; train_step refused by the C API; "
            "llama.dm's transposed weights quantized as their transposes, logits within %.1e; gpt.dm's, c_attn's windows "
            "included, within %.1e; with --quantize-embeddings the tables too, within %.1e" % (d8, d4, dl, dg, de))


if __name__ == "__main__":
    sys.exit(dmcrun.reference_main(sys.argv, body))
