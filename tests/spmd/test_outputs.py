"""test_outputs.py DMC SRCROOT: outputs gathered when asked for equal the serial program's.

Training steps no longer gather outputs; `<model>_output_<name>` gathers them from every
rank when the trainer asks (evaluation, sampling). From the initial weights (--steps 0,
so no training rounding enters):
  - mlp.dm's Fashion-MNIST test accuracy (argmax of every one of 10000 rows of logits)
    is the serial program's on data=2, tensor=2, data=2 x tensor=2, data=2 x
    pipeline=2 (4 micro-batches) and data=2 with ZeRO 3;
  - a byte-level gpt.dm (V=256) samples the same 48 bytes after a prompt (temperature 1,
    the same seed) as the serial program on data=2, tensor=2 (vocabulary-split logits),
    data=2 x tensor=2, pipeline=2 (2 micro-batches) and data=2 x tensor=2 with ZeRO 3 (the
    parameters gathered from shares for the forward pass): each byte is a draw from the
    softmax of a whole row of logits, so a missing or misplaced block changes the text,
    while float rounding moves a draw only within 1e-7 of a boundary.
Exit 77 without the Fashion-MNIST data set (the mlp part is then skipped, the gpt part
still runs).
"""
import os
import subprocess
import sys
import tempfile


def run(dmc, dm, tmp, args):
    # sampled bytes are any bytes: read them as latin-1, one character each
    r = subprocess.run([dmc, "run", dm, "--quiet"] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       encoding="latin-1", timeout=600, env=dict(os.environ, TMPDIR=tmp))
    if r.returncode != 0:
        raise SystemExit("FAIL: dmc run %s %s exited %d:\n%s" % (os.path.basename(dm), " ".join(args), r.returncode,
                                                                 r.stderr[-3000:]))
    return r.stdout + r.stderr


def accuracy(text):
    for line in text.splitlines():
        if line.startswith("test accuracy"):
            return line.split()[2]
    return None


def sample(text):
    """What follows the sample header the trainer prints."""
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("sample"):
            return "\n".join(lines[k:])
    return text


def quick_or(meshes):
    """All of them; with DMC_TEST_QUICK=1 (the sanitized build) the last two, the most composed."""
    return meshes[-2:] if os.environ.get("DMC_TEST_QUICK") == "1" else meshes


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    mlp, gpt = os.path.join(root, "examples", "mlp.dm"), os.path.join(root, "examples", "gpt.dm")
    failures, checks = [], 0
    with tempfile.TemporaryDirectory(prefix="dmc-outputs-") as tmp:
        have_mnist = os.path.isdir("/usr/share/datasets/fashion-mnist")
        if have_mnist:
            want = accuracy(run(dmc, mlp, tmp, ["--steps", "0"]))
            for mesh in quick_or((["--mesh", "data=2"], ["--mesh", "tensor=2"], ["--mesh", "data=2,tensor=2"],
                                  ["--mesh", "data=2,pipeline=2", "--microbatches", "4"], ["--mesh", "data=2", "--zero", "3"])):
                checks += 1
                got = accuracy(run(dmc, mlp, tmp, ["--steps", "0"] + mesh))
                print("mlp %-42s test accuracy %s (serial %s)" % (" ".join(mesh), got, want))
                if got != want or want is None:
                    failures.append("mlp %s: accuracy %s, serial %s" % (" ".join(mesh), got, want))
        else:
            print("mlp part skipped: no Fashion-MNIST under /usr/share/datasets/fashion-mnist")
        corpus = os.path.join(root, "README.md")
        common = ["--set", "V=256,T=32,C=64,NH=4,L=2,B=4", "--data", "text:" + corpus, "--steps", "0", "--sample", "48",
                  "--temperature", "1", "--seed", "3", "--prompt", "The compiler "]
        want = sample(run(dmc, gpt, tmp, common))
        for mesh in quick_or((["--mesh", "data=2"], ["--mesh", "tensor=2"], ["--mesh", "data=2,tensor=2"],
                              ["--mesh", "pipeline=2", "--microbatches", "2"], ["--mesh", "data=2,tensor=2", "--zero", "3"])):
            checks += 1
            got = sample(run(dmc, gpt, tmp, common + mesh))
            same = got == want
            print("gpt %-42s sample %s" % (" ".join(mesh), "identical" if same else "DIFFERS"))
            if not same:
                failures.append("gpt %s: sample\n%s\nserial\n%s" % (" ".join(mesh), got, want))
        # weights in and out through the ranks' shares: the serial program's initial weights
        # loaded (--init) on data=2 x tensor=2 with ZeRO 3 in small buckets (a tensor's
        # elements split between ranks' shares) and saved again are the same bytes
        serial_file, zero_file = os.path.join(tmp, "serial.safetensors"), os.path.join(tmp, "zero3.safetensors")
        run(dmc, gpt, tmp, common[:6] + ["--save", serial_file])
        run(dmc, gpt, tmp, common[:6] + ["--init", serial_file, "--save", zero_file, "--mesh", "data=2,tensor=2",
                                          "--zero", "3", "--bucket-mb", "0.004"])
        checks += 1
        with open(serial_file, "rb") as a, open(zero_file, "rb") as b:
            same = a.read() == b.read()
        print("gpt %-42s --init then --save %s" % ("--mesh data=2,tensor=2 --zero 3", "identical" if same else "DIFFERS"))
        if not same:
            failures.append("gpt ZeRO 3: the weights saved after --init differ from the file loaded")
    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
