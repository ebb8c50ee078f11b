#!/usr/bin/python3
"""test_predict.py: `dmc run --predict` (meson test `ref-predict`).

usage: /usr/bin/python3 tests/ref/test_predict.py DMC SOURCE_ROOT

examples/mlp.dm with small dims (--set B=8,H=64) is trained 3 steps on a batch file and
saved; then --predict --init the saved weights on batch files of 5 rows (fewer than the
batch: padded) and 21 rows (three calls: 8, 8, 5), and:

  a) the logits equal a PyTorch float32 forward with the saved weights within 1e-5
     (both sum in float32 in different orders: a few ulps of O(1) logits);
  b) the same predictions on the meshes data=2, tensor=2, pipeline=2 (2 micro-batches),
     data=2 with ZeRO 3, 2 micro-batches (accumulation) and data=2 x tensor=2 x
     pipeline=2 equal the serial program's within 1e-5, and the 5-row file's equal
     the first 5 rows of the 21-row file's (rows do not influence each other);
  c) examples/gpt.dm (V=256,T=64,C=128,NH=4,L=4,B=16) the same way with gpt_torch
     (1e-4), tensor=2 and pipeline=2 vs serial (1e-5);
  d) the C API (predict_api.c, under ASan and UBSan where available): row bounds, a NULL
     input, NULL targets, rows equal to forward's on the zero-padded batch bit for bit,
     nothing written past them, training after predict unchanged;
  e) failures: a missing input, a wrong dtype, a wrong shape, an unwritable --out
     (exit 1, the message naming the file and the problem, an existing --out left as
     it was), --predict without --out and --out without --predict (exit 2), a model
     whose output combines rows (exit 1, naming the line), an --out that is the --batch-file
     or the --init file (the same name, another path, a hard link: exit 1, both left as
     they were), a bad token id in gpt.dm's second call (named at the file's row, with the
     call's rows as an inclusive range). The targets (y) are not needed in the batch file.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dmcrun  # noqa: E402
from mlp_torch import mlp_logits  # noqa: E402

SETS = "B=8,H=64"
GPT_SETS = "V=256,T=64,C=128,NH=4,L=4,B=16"


def run(dmc, src, args, cwd, mesh=None, expect=0, sets=SETS):
    cmd = [dmc, "run", src, "--set", sets] + (mesh.split() if mesh else [])
    cmd += dmcrun.target_args() + ["--"] + args + ["--quiet"]
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    if r.returncode != expect:
        raise dmcrun.Failure("%s: exit %d, expected %d\n%s" % (" ".join(cmd), r.returncode, expect, r.stderr))
    return r.stderr


def check_failures(dmc, src, d, stio, np):
    rng = np.random.default_rng(3)
    cases = [
        ("missing.st", {"z": rng.random((4, 784), dtype=np.float32)}, "no tensor 'x' for model input x"),
        ("dtype.st", {"x": np.zeros((4, 784), dtype=np.int32)}, "tensor 'x': dtype I32 but model input x needs F32"),
        ("shape.st", {"x": np.zeros((4, 780), dtype=np.float32)}, "tensor 'x': shape [4, 780] but model input x needs F32 [rows, 784]"),
        ("empty.st", {"x": np.zeros((0, 784), dtype=np.float32)}, "tensor 'x' has no rows to predict"),
    ]
    for name, tensors, want in cases:
        stio.save(tensors, os.path.join(d, name))
        err = run(dmc, src, ["--predict", "--batch-file", name, "--out", "keep.st"], d, expect=1)
        if name not in err or want not in err:
            raise dmcrun.Failure("%s: expected a message naming the file and '%s', got: %s" % (name, want, err))
    err = run(dmc, src, ["--predict", "--batch-file", "p5.st", "--out", "nodir/o.st"], d, expect=1)
    if "--out nodir/o.st: cannot write there: No such file or directory" not in err:
        raise dmcrun.Failure("unwritable --out: %s" % err)
    os.makedirs(os.path.join(d, "adir"), exist_ok=True)
    err = run(dmc, src, ["--predict", "--batch-file", "p5.st", "--out", "adir"], d, expect=1)
    if "--out adir: cannot write there: it is a directory" not in err:
        raise dmcrun.Failure("--out naming a directory: %s" % err)
    if open(os.path.join(d, "keep.st"), "rb").read() != b"old":
        raise dmcrun.Failure("a failed --predict changed an existing --out")
    check_out_distinct(dmc, src, d)
    for args, want in ((["--predict", "--batch-file", "p5.st"], "--predict needs --out"),
                       (["--out", "o.st", "--batch-file", "p5.st"], "--out only applies with --predict"),
                       (["--predict", "--batch-file", "p5.st", "--out", "o.st", "--memory"],
                        "--predict trains nothing: it cannot be combined with --memory")):
        err = run(dmc, src, args, d, expect=2)
        if want not in err:
            raise dmcrun.Failure("%s: expected '%s', got: %s" % (args, want, err))
    print("failures: messages and exit statuses as documented")


def check_out_distinct(dmc, src, d):
    """An --out that names the --batch-file or the --init file (the same string, another path,
    a hard link) is refused: the outputs would replace the inputs or the weights."""
    os.link(os.path.join(d, "p5.st"), os.path.join(d, "p5-link.st"))
    before = {f: open(os.path.join(d, f), "rb").read() for f in ("p5.st", "w.st")}
    for out, want in (("p5.st", "--out p5.st is the --batch-file p5.st: the outputs would replace the inputs"),
                      ("p5-link.st", "--out p5-link.st is the --batch-file p5.st"),
                      ("w.st", "--out w.st is the --init file w.st: the outputs would replace the weights"),
                      ("./w.st", "--out ./w.st is the --init file w.st")):
        err = run(dmc, src, ["--predict", "--init", "w.st", "--batch-file", "p5.st", "--out", out], d, expect=1)
        if want not in err:
            raise dmcrun.Failure("--out %s: expected '%s', got: %s" % (out, want, err))
    for f, blob in before.items():
        if open(os.path.join(d, f), "rb").read() != blob:
            raise dmcrun.Failure("a refused --predict changed %s" % f)


MIX_DM = """# mix.dm: an output that mixes rows (minus the batch's mean)
dim B = 4
dim C = 3
input x : f32[B, C]
input y : i32[B]
param w : f32[C, C] = uniform(-1, 1)
h = x @ w
e = h - mean(h, B)
loss = cross_entropy(e, y)
output e
minimize loss
optimizer sgd(lr = 0.1)
"""


# Ways an output's rows can depend on other rows, each (line 8 of MIX_DM, the line named):
# a reduction over the batch; a softmax along it and a [B, B] product, which keep the batch
# dim (a padded zero row then took part in the softmax: columns summing to 0.91, 0.26)
MIXES = ("e = h - mean(h, B)", "e = softmax(h, B)", "e = (h @ transpose(h)) @ h")


def check_unsupported(dmc, d):
    """A model whose output combines rows cannot predict: exit 1 naming the line."""
    for line in MIXES:
        with open(os.path.join(d, "mix.dm"), "w") as f:
            f.write(MIX_DM.replace("e = h - mean(h, B)", line))
        err = run(dmc, os.path.join(d, "mix.dm"), ["--predict", "--batch-file", "p5.st", "--out", "o.st"], d, expect=1,
                  sets="C=3")
        want = "model 'mix' cannot predict: mix.dm:8 combines rows of the batch dim B: " + line
        if want not in err:
            raise dmcrun.Failure("mix.dm: expected '%s', got: %s" % (want, err))
    print("models mixing rows (%d ways): cannot predict, naming the line" % len(MIXES))


def check_api(dmc, root, d):
    """tests/ref/predict_api.c against mlp.c (B=8, H=64): row bounds, NULL input, bitwise
    equal to forward on the zero-padded batch, nothing written past the rows, training
    unchanged by predict; built with ASan and UBSan where the compiler has them."""
    if dmcrun.TARGET != "c":
        return
    out = os.path.join(d, "api")
    os.makedirs(out, exist_ok=True)
    subprocess.run([dmc, os.path.join(root, "examples", "mlp.dm"), "--set", SETS, "-o", out], check=True)
    dmcrun.c_api_probe(dmc, os.path.join(root, "tests", "ref", "predict_api.c"), os.path.join(out, "mlp.c"), out)


def check_gpt(dmc, root, d, stio, np, torch):
    """examples/gpt.dm (V=256,T=64,C=128,NH=4,L=4,B=16) after one step: 5 and 21 rows (16 + 5)
    of tokens vs gpt_torch's forward (|diff| <= 1e-4: logits sum 128-long products through
    4 layers and softmaxes in float32, in other orders), and tensor=2 and pipeline=2 vs
    serial (1e-5); no targets in the file."""
    import gpt_torch
    src = os.path.join(root, "examples", "gpt.dm")
    rng = np.random.default_rng(11)
    stio.save({"tokens": rng.integers(0, 256, (1, 16, 64), dtype=np.int32),
               "targets": rng.integers(0, 256, (1, 16, 64), dtype=np.int32)}, os.path.join(d, "gtrain.st"))
    run(dmc, src, ["--batch-file", "gtrain.st", "--steps", "1", "--save", "gw.st"], d, sets=GPT_SETS)
    w = {k: torch.from_numpy(v) for k, v in stio.load(os.path.join(d, "gw.st")).items()}
    tokens = rng.integers(0, 256, (21, 64), dtype=np.int32)
    stio.save({"tokens": tokens}, os.path.join(d, "g21.st"))
    stio.save({"tokens": tokens[:5]}, os.path.join(d, "g5.st"))
    with torch.no_grad():
        _, want = gpt_torch.forward(torch, w, torch.from_numpy(tokens).long(), torch.zeros(21, 64, dtype=torch.long), 4, 4)
    want = want.numpy()
    serial = None
    for mesh in quick_or((None, "--mesh tensor=2", "--mesh pipeline=2 --microbatches 2")):
        got = {}
        for n in (5, 21):
            run(dmc, src, ["--predict", "--init", "gw.st", "--batch-file", "g%d.st" % n, "--out", "go.st"], d, mesh, sets=GPT_SETS)
            got[n] = stio.load(os.path.join(d, "go.st"))["logits"]
            if got[n].shape != (n, 64, 256):
                raise dmcrun.Failure("gpt %s: logits %s" % (mesh, got[n].shape))
        rows = float(np.abs(got[5] - got[21][:5]).max())
        if mesh is None:
            serial = got
            err = float(np.abs(got[21] - want).max())
            if err > 1e-4 or rows > 1e-5:
                raise dmcrun.Failure("gpt predict vs torch: max |diff| %.3g > 1e-4 (5 rows vs 21: %.3g)" % (err, rows))
            print("gpt serial vs torch: max |diff| %.3g" % err)
        else:
            err = max(float(np.abs(got[n] - serial[n]).max()) for n in (5, 21))
            if err > 1e-5 or rows > 1e-5:
                raise dmcrun.Failure("gpt %s vs serial: max |diff| %.3g (5 rows vs 21: %.3g)" % (mesh, err, rows))
            print("gpt %s vs serial: max |diff| %.3g" % (mesh, err))
    # a bad id in the second call's rows (16 .. 20) is named at the file's row, 18
    bad = tokens.copy()
    bad[18, 3] = 300
    stio.save({"tokens": bad}, os.path.join(d, "gbad.st"))
    err = run(dmc, src, ["--predict", "--init", "gw.st", "--batch-file", "gbad.st", "--out", "gbad-out.st"], d, expect=1,
              sets=GPT_SETS)
    for want in ("predict of rows 16 .. 20 of gbad.st: ", "id 300 at [18, 3] of 'tokens' is outside [0, 256)"):
        if want not in err:
            raise dmcrun.Failure("a bad id at the file's row 18: expected '%s' in: %s" % (want, err))


def quick_or(meshes):
    """All of them; with DMC_TEST_QUICK=1 (the sanitized build) the serial one (the oracle's
    first comparison) and the most composed."""
    return (meshes[0], meshes[-1]) if os.environ.get("DMC_TEST_QUICK") == "1" else meshes


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    dmcrun.require_target()
    ref = dmcrun.import_reference()
    if ref is None:
        return 77
    np, torch = ref
    import stio
    dmc, root = sys.argv[1], sys.argv[2]
    src = os.path.join(root, "examples", "mlp.dm")
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(7)
        stio.save({"x": rng.random((3, 8, 784), dtype=np.float32),
                   "y": rng.integers(0, 10, (3, 8), dtype=np.int32)}, os.path.join(d, "train.st"))
        run(dmc, src, ["--batch-file", "train.st", "--steps", "3", "--save", "w.st"], d)
        w = stio.load(os.path.join(d, "w.st"))
        x21 = rng.random((21, 784), dtype=np.float32)
        stio.save({"x": x21[:5]}, os.path.join(d, "p5.st"))
        stio.save({"x": x21}, os.path.join(d, "p21.st"))
        with open(os.path.join(d, "keep.st"), "wb") as f:
            f.write(b"old")
        worst = 0.0
        serial = {}
        for mesh in quick_or((None, "--mesh data=2", "--mesh tensor=2", "--mesh pipeline=2 --microbatches 2", "--mesh data=2 --zero 3",
                     "--microbatches 2", "--mesh data=2,tensor=2,pipeline=2 --microbatches 2")):
            got = {}
            for n in (5, 21):
                out = "o%d_%s.st" % (n, (mesh or "serial").replace("=", "").replace(" ", "").replace("-", ""))
                run(dmc, src, ["--predict", "--init", "w.st", "--batch-file", "p%d.st" % n, "--out", out], d, mesh)
                o = stio.load(os.path.join(d, out))
                if set(o) != {"logits"} or o["logits"].shape != (n, 10):
                    raise dmcrun.Failure("%s: tensors %s" % (out, {k: v.shape for k, v in o.items()}))
                got[n] = o["logits"]
            if mesh is None:
                serial = got
                want = mlp_logits(torch, w, x21)
                err = float(np.abs(got[21] - want).max())
                worst = max(worst, err)
                if err > 1e-5:
                    raise dmcrun.Failure("serial predict vs torch: max |diff| %.3g > 1e-5" % err)
                print("serial vs torch: max |diff| %.3g" % err)
            else:
                err = max(float(np.abs(got[n] - serial[n]).max()) for n in (5, 21))
                if err > 1e-5:
                    raise dmcrun.Failure("%s vs serial: max |diff| %.3g > 1e-5" % (mesh, err))
                print("%s vs serial: max |diff| %.3g" % (mesh, err))
            rows = float(np.abs(got[5] - got[21][:5]).max())
            if rows > 1e-5:
                raise dmcrun.Failure("%s: 5 rows alone vs in 21: max |diff| %.3g" % (mesh or "serial", rows))
        check_failures(dmc, src, d, stio, np)
        check_unsupported(dmc, d)
        check_api(dmc, root, d)
        check_gpt(dmc, root, d, stio, np, torch)
    print("ok")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except dmcrun.Failure as e:
        print("FAIL: %s" % e, file=sys.stderr)
        sys.exit(1)
