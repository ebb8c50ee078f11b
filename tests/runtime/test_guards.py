#!/usr/bin/env python3
"""test_guards.py DMC: what ends `dmc run` cleanly (docs/trainer.md, "Stopping").

  - a diverging run (sgd with lr = 1e30) stops at the step whose loss is not finite,
    naming the step and the first parameter whose gradient is not finite, exits 1, and
    leaves the --save file as it was: serial, data=2 x pipeline=2 and tensor=2 (every rank
    must stop at the same step, or the run hangs until the deadline);
  - a NaN in the batch file's input x (step 3, row 5) is named as such, whether it shows in
    the loss (relu passes NaN on, as PyTorch's does) or only in a gradient;
  - an unwritable --save path is refused before the first step;
  - SIGTERM and SIGINT sent to dmc during training: the trainer stops at a step boundary,
    says so, writes no --save, dmc exits 128 + the signal and removes its build directory
    (TMPDIR is a directory of the test's, empty afterwards); serial and data=2.
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples", "mlp.dm")
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures += 1


def write_safetensors(path, tensors):
    """tensors: name -> (dtype 'F32' | 'I32', shape, flat list of values)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        blob = struct.pack("<%d%s" % (len(values), "f" if dtype == "F32" else "i"), *values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def mlp_batch_size():
    with open(MLP) as f:
        return int(re.search(r"^dim B = (\d+)", f.read(), re.M).group(1))


def run(dmc, args, tmp, env=None):
    return subprocess.run([dmc, "run"] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600, env=env)


def diverging(dmc, tmp):
    with open(MLP) as f:
        src = re.sub(r"optimizer \w+\([^)]*\)", "optimizer sgd(lr = 1e30)", f.read())
    path = os.path.join(tmp, "diverge.dm")
    with open(path, "w") as f:
        f.write(src)
    good = os.path.join(tmp, "good.safetensors")
    for mesh in [[], ["--mesh", "data=2,pipeline=2"], ["--mesh", "tensor=2"]]:
        with open(good, "w") as f:
            f.write("the weights of a good run")
        start = time.monotonic()
        r = run(dmc, [path, "--steps", "20", "--quiet", "--save", good] + mesh, tmp)
        secs = time.monotonic() - start
        msg = re.search(r"step (\d+): the loss is not finite .*gradient holds a non-finite value is '([\w.]+)'", r.stderr)
        check(r.returncode == 1 and msg is not None and secs < 60,
              "diverging run %s stops at a non-finite loss, naming step and parameter (%s)" %
              (" ".join(mesh) or "serial", r.stderr.strip()[-240:]))
        if msg:
            steps = re.findall(r"^step (\d+) loss", r.stdout, re.M)
            check(int(msg.group(1)) == len(steps) + 1 and msg.group(2) == "fc1.weight",
                  "the step named is the first not printed (%s after %d printed), the parameter the first (%s)"
                  % (msg.group(1), len(steps), msg.group(2)))
        with open(good) as f:
            check(f.read() == "the weights of a good run", "--save's file is left as it was")


def nan_input(dmc, tmp):
    B, steps = mlp_batch_size(), 4
    xs = [0.5] * (steps * B * 784)
    xs[(2 * B + 5) * 784 + 17] = float("nan")  # step 3, row 5
    ys = [i % 10 for i in range(steps * B)]
    batches = os.path.join(tmp, "nan.safetensors")
    write_safetensors(batches, {"x": ("F32", [steps, B, 784], xs), "y": ("I32", [steps, B], ys)})
    r = run(dmc, [MLP, "--batch-file", batches, "--steps", "4", "--quiet"], tmp)
    check(r.returncode == 1 and re.search(r"step 3: (the loss|a gradient) is not finite .*input 'x' holds a non-finite value \(row 5\)",
                                          r.stderr) is not None,
          "a NaN in the batch file is named: input, step and row (%s)" % r.stderr.strip()[-200:])


def unwritable_save(dmc, tmp):
    r = run(dmc, [MLP, "--steps", "2", "--quiet", "--save", os.path.join(tmp, "missing-dir", "w.safetensors")], tmp)
    check(r.returncode == 1 and "--save" in r.stderr and "cannot write there" in r.stderr and "step 1" not in r.stdout,
          "an unwritable --save path is refused before training (%s)" % r.stderr.strip()[-200:])


def stopped_by(dmc, tmp, sig, mesh):
    build_tmp = tempfile.mkdtemp(dir=tmp, prefix="tmpdir-")
    save = os.path.join(tmp, "stopped.safetensors")
    env = dict(os.environ, TMPDIR=build_tmp)
    p = subprocess.Popen([dmc, "run", MLP, "--steps", "100000", "--quiet", "--save", save] + mesh, cwd=tmp,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("step 3 "):
            break
    p.send_signal(sig)
    start = time.monotonic()
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    secs = time.monotonic() - start
    lines += out.splitlines(True)
    last = re.findall(r"^step (\d+) loss", "".join(lines), re.M)
    said = re.search(r"stopped by a signal after step (\d+) of 100000; --save was not written", err)
    what = "%s to dmc run %s" % (signal.Signals(sig).name, " ".join(mesh) or "serial")
    check(p.returncode == 128 + sig and said is not None and secs < 10,
          "%s: the trainer stops at a step boundary, exit %d (got %s in %.1f s; %s)" %
          (what, 128 + sig, p.returncode, secs, err.strip()[-200:]))
    if said and last:
        check(int(said.group(1)) == int(last[-1]), "%s: the step it stopped after is the last printed (%s, %s)"
              % (what, said.group(1), last[-1]))
    check(not os.path.exists(save), "%s: --save not written" % what)
    check(os.listdir(build_tmp) == [], "%s: the build directory is removed (%s)" % (what, os.listdir(build_tmp)))


def main():
    dmc = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="dmc-guards-") as tmp:
        diverging(dmc, tmp)
        nan_input(dmc, tmp)
        unwritable_save(dmc, tmp)
        stopped_by(dmc, tmp, signal.SIGTERM, [])
        stopped_by(dmc, tmp, signal.SIGINT, ["--mesh", "data=2"])
    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
