#!/usr/bin/env python3
"""test_guards.py DMC: what ends `dmc run` cleanly (docs/trainer.md, "Stopping").

  - a diverging run (sgd with lr = 1e30) stops at the step whose loss is not finite,
    naming the step and the first parameter whose gradient is not finite, exits 1, and
    leaves the --save file as it was: serial, data=2 x pipeline=2 and tensor=2 (every rank
    must stop at the same step, or the run hangs until the deadline);
  - a NaN in the batch file's input x (step 3, row 5) is named as such, whether it shows in
    the loss (relu passes NaN on, as PyTorch's does) or only in a gradient;
  - an unwritable --save path is refused before the first step, and so is one that is a
    directory (it used to fail only after training);
  - an update that overflows (sgd with lr = 1e38 on pixels in [0, 100): step 1's loss and
    gradients are finite, its weights are not) writes neither the checkpoint nor --save,
    names the parameter and exits 1 (it used to save ~30k infs with exit 0); serial and
    data=2;
  - a NaN in --init's weights is named with its file and tensor, for training, --steps 0
    --save and --predict (it used to be blamed on another tensor's gradient, or written);
  - a final checkpoint that cannot be written (a full disk: a 64 KiB tmpfs, root only)
    still leaves --save written, and the run exits 1 with the checkpoint's error;
  - SIGTERM and SIGINT sent to dmc during training: the trainer stops at a step boundary,
    says so, prints no test accuracy for the epoch it cut short, writes no --save, dmc exits
    128 + the signal and removes its build directory
    (TMPDIR is a directory of the test's, empty afterwards); serial and data=2;
  - no file the trainer writes is one it reads, nor another it writes: --dump-grads or
    --save over --init's weights (also through a link, or spelled otherwise), --save over
    the --batch-file, a --data text: file or the --resume checkpoint, --save into
    --checkpoint's own names, --dump-grads over --save, --save-quantized over --init (a
    --quantize program): refused before the first step, naming both, the files as they
    were (each used to be overwritten, exit 0);
  - --trace's picture (FILE.svg) is tried before training as FILE is, and --save is written
    before the trace: a picture that cannot be written after training still leaves --save
    written, exit 1 naming both (it used to lose the trained weights).
Prints one line per check; exits 1 on any failure.
"""
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MLP = os.path.join(ROOT, "examples", "mlp.dm")
GPT = os.path.join(ROOT, "examples", "gpt.dm")
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


def read_safetensors(path):
    """name -> (dtype, shape, flat list of values) of a file of F32/I32 tensors."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], list(struct.unpack("<%d%s" % ((b - a) // 4, "f" if t["dtype"] == "F32" else "i"),
                                                                 data[a:b])))
    return out


SMALL = ["--set", "B=8,D=48,H=32,K=10"]


def small_batches(tmp, scale, steps=2):
    """A batch file of the small mlp: pixels uniform in [0, scale)."""
    import random
    rnd = random.Random(5)
    path = os.path.join(tmp, "small-%g.safetensors" % scale)
    write_safetensors(path, {"x": ("F32", [steps, 8, 48], [rnd.uniform(0, scale) for _ in range(steps * 8 * 48)]),
                             "y": ("I32", [steps, 8], [rnd.randrange(10) for _ in range(steps * 8)])})
    return path


def mlp_batch_size():
    with open(MLP) as f:
        return int(re.search(r"^dim B = (\d+)", f.read(), re.M).group(1))


def run(dmc, args, tmp, env=None):
    return subprocess.run([dmc, "run"] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600, env=env)


def mlp_with_optimizer(tmp, name, optimizer):
    """examples/mlp.dm with its optimizer statement replaced, as tmp/NAME.dm."""
    with open(MLP) as f:
        src = re.sub(r"optimizer \w+\([^)]*\)", "optimizer " + optimizer, f.read())
    path = os.path.join(tmp, name + ".dm")
    with open(path, "w") as f:
        f.write(src)
    return path


def diverging(dmc, tmp):
    path = mlp_with_optimizer(tmp, "diverge", "sgd(lr = 1e30)")
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


def save_is_directory(dmc, tmp):
    target = os.path.join(tmp, "a-directory")
    os.makedirs(target, exist_ok=True)
    r = run(dmc, [MLP] + SMALL + ["--batch-file", small_batches(tmp, 1), "--steps", "2", "--quiet", "--save", target], tmp)
    check(r.returncode == 1 and "it is a directory" in r.stderr and "step 1" not in r.stdout and os.listdir(target) == [],
          "a --save path that is a directory is refused before training (%s)" % r.stderr.strip()[-200:])


def save_through_link(dmc, tmp):
    """--save to a symbolic link writes the file it names (the rename replaced the link with
    a file of its own, the target kept its old bytes); to a FIFO, refused before training
    (the rename would have replaced it: as root, `--save /dev/null` the device itself)."""
    real = os.path.join(tmp, "real")
    os.makedirs(real, exist_ok=True)
    target, link = os.path.join(real, "w.safetensors"), os.path.join(tmp, "link.safetensors")
    with open(target, "w") as f:
        f.write("old")
    os.symlink(target, link)
    r = run(dmc, [MLP] + SMALL + ["--batch-file", small_batches(tmp, 1), "--steps", "1", "--quiet", "--save", link], tmp)
    with open(target, "rb") as f:
        written = f.read()
    check(r.returncode == 0 and os.path.islink(link) and written != b"old" and len(written) > 8,
          "--save through a link: the link stays, its target is written (%d, %s)" % (r.returncode, r.stderr.strip()[-200:]))
    fifo = os.path.join(tmp, "save.fifo")
    os.mkfifo(fifo)
    r = run(dmc, [MLP] + SMALL + ["--batch-file", small_batches(tmp, 1), "--steps", "1", "--quiet", "--save", fifo], tmp)
    check(r.returncode == 1 and "not a regular file (a FIFO)" in r.stderr and "step 1" not in r.stdout and
          stat.S_ISFIFO(os.lstat(fifo).st_mode),
          "--save naming a FIFO: refused before training, the FIFO kept (%s)" % r.stderr.strip()[-200:])


def overflowing_update(dmc, tmp):
    path = mlp_with_optimizer(tmp, "overflow", "sgd(lr = 1e38)")
    batches = small_batches(tmp, 100)
    for mesh in [[], ["--mesh", "data=2"]]:
        good, ck = os.path.join(tmp, "good.safetensors"), os.path.join(tmp, "ck-overflow")
        with open(good, "w") as f:
            f.write("the weights of a good run")
        r = run(dmc, [path] + SMALL + mesh + ["--batch-file", batches, "--steps", "1", "--quiet", "--save", good,
                                              "--checkpoint", ck], tmp)
        what = " ".join(mesh) or "serial"
        check(r.returncode == 1 and re.search(r"step-00000001\.safetensors not written: parameter '[\w.]+' holds a "
                                              r"non-finite value \(-?inf at element \d+ of \[", r.stderr) is not None
              and "step 1 loss" in r.stdout,
              "%s: an update to infinite weights writes no checkpoint, names the parameter, exit 1 (exit %d, %s)"
              % (what, r.returncode, r.stderr.strip()[-240:]))
        check(os.listdir(ck) == [], "%s: no checkpoint file (%s)" % (what, os.listdir(ck)))
        with open(good) as f:
            check(f.read() == "the weights of a good run", "%s: --save's file is left as it was" % what)
        shutil.rmtree(ck)
        # without --checkpoint, --save itself refuses
        r = run(dmc, [path] + SMALL + mesh + ["--batch-file", batches, "--steps", "1", "--quiet", "--save", good], tmp)
        check(r.returncode == 1 and "good.safetensors not written: parameter" in r.stderr,
              "%s: --save of infinite weights is refused (exit %d, %s)" % (what, r.returncode, r.stderr.strip()[-200:]))


def nan_in_init(dmc, tmp):
    batches = small_batches(tmp, 1)
    weights = os.path.join(tmp, "w.safetensors")
    r = run(dmc, [MLP] + SMALL + ["--batch-file", batches, "--steps", "0", "--quiet", "--save", weights], tmp)
    check(r.returncode == 0, "--steps 0 --save writes the initial weights (%s)" % r.stderr.strip()[-200:])
    tensors = read_safetensors(weights)
    dtype, shape, values = tensors["fc1.weight"]
    values[5 * shape[1] + 3] = float("nan")
    bad = os.path.join(tmp, "nan-weights.safetensors")
    write_safetensors(bad, tensors)
    want = "nan-weights.safetensors: tensor 'fc1.weight' (parameter 'fc1.weight') holds a non-finite value: nan at " \
           "element %d of [48, 32]" % (5 * shape[1] + 3)
    out = os.path.join(tmp, "from-nan.safetensors")
    for what, args in [("training", ["--steps", "2"]), ("--steps 0 --save", ["--steps", "0", "--save", out]),
                       ("--predict", ["--predict", "--out", out]), ("training data=2", ["--steps", "2", "--mesh", "data=2"])]:
        r = run(dmc, [MLP] + SMALL + ["--batch-file", batches if what != "--predict" else predict_rows(tmp),
                                      "--init", bad, "--quiet"] + args, tmp)
        check(r.returncode == 1 and want in r.stderr and "step 1" not in r.stdout and not os.path.exists(out),
              "a NaN in --init is named, %s: exit %d, %s" % (what, r.returncode, r.stderr.strip()[-240:]))


def predict_rows(tmp):
    path = os.path.join(tmp, "rows.safetensors")
    write_safetensors(path, {"x": ("F32", [3, 48], [0.25] * (3 * 48))})
    return path


def final_checkpoint_disk_full(dmc, tmp):
    if os.geteuid() != 0:
        print("skip  a full disk under the final checkpoint: needs root to mount a tmpfs")
        return
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", full]).returncode != 0:
        print("skip  a full disk under the final checkpoint: mount -t tmpfs failed here")
        return
    try:
        save = os.path.join(tmp, "kept.safetensors")
        r = run(dmc, [MLP, "--set", "B=8,D=784,H=64,K=10", "--batch-file", mnist_like(tmp), "--steps", "2", "--quiet",
                      "--save", save, "--checkpoint", os.path.join(full, "ck")], tmp)
        check(r.returncode == 1 and "No space left on device" in r.stderr and "(--save %s was written)" % save in r.stderr,
              "a final checkpoint on a full disk fails the run after --save (exit %d, %s)" % (r.returncode,
                                                                                            r.stderr.strip()[-240:]))
        check(os.path.exists(save) and "fc1.weight" in read_safetensors(save),
              "--save is written though the final checkpoint was not")
    finally:
        subprocess.run(["umount", full])


def mnist_like(tmp):
    path = os.path.join(tmp, "784.safetensors")
    write_safetensors(path, {"x": ("F32", [2, 8, 784], [0.5] * (2 * 8 * 784)), "y": ("I32", [2, 8], [3] * 16)})
    return path


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
    # the epoch was cut short: no test pass after the stop, and no accuracy line for it
    check(not re.search(r"^epoch \d+ test accuracy", "".join(lines), re.M),
          "%s: no epoch's test accuracy for the epoch the stop cut short" % what)
    check(os.listdir(build_tmp) == [], "%s: the build directory is removed (%s)" % (what, os.listdir(build_tmp)))


def outside_the_steps(dmc, tmp):
    """A signal outside the step loop ends the program at once (the stop request waits for
    a step boundary only while steps run: a sample after training ran to its end, exit 0),
    and a FIFO named as --batch-file is refused, not opened (its open waited for a writer
    for ever, the SIGTERM of `timeout` swallowed)."""
    keep = os.path.join(tmp, "lm")
    subprocess.run([dmc, "run", GPT, "--set", "V=256,T=8,C=16,NH=2,L=1,B=2", "--keep", keep, "--", "--steps", "0",
                    "--sample", "1", "--quiet"], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    prog = os.path.join(keep, "gpt")
    p = subprocess.Popen([prog, "--steps", "0", "--sample", "100000000", "--quiet"], cwd=tmp,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    try:
        p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
    check(p.returncode == -signal.SIGINT, "SIGINT while sampling: the program ends at once (got %s)" % p.returncode)
    fifo = os.path.join(tmp, "batches.fifo")
    os.mkfifo(fifo)
    try:
        r = subprocess.run([prog, "--batch-file", fifo, "--steps", "1"], cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=10)
        check(r.returncode == 1 and "not a regular file (a FIFO)" in r.stderr,
              "a FIFO as --batch-file: refused (got %d: %s)" % (r.returncode, r.stderr.strip()[-200:]))
    except subprocess.TimeoutExpired:
        check(False, "a FIFO as --batch-file: the program waited 10 s in its open")


def keep_program(dmc, tmp, name, args, trainer_args):
    """dmc run ARGS --keep tmp/NAME -- TRAINER_ARGS: the program's path, or None (a failed check)."""
    keep = os.path.join(tmp, name)
    r = subprocess.run([dmc, "run"] + args + ["--keep", keep, "--"] + trainer_args, cwd=tmp, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    model = os.path.splitext(os.path.basename(args[0]))[0]
    check(r.returncode == 0, "building %s with %s (%s)" % (model, " ".join(args[1:]), r.stderr.strip()[-200:]))
    return os.path.join(keep, model) if r.returncode == 0 else None


def contents(tmp, names):
    """name -> bytes of each file (None: missing)."""
    out = {}
    for n in names:
        p = os.path.join(tmp, n)
        out[n] = open(p, "rb").read() if os.path.isfile(p) else None
    return out


def outputs_over_inputs(dmc, tmp):
    """Every file the trainer writes is distinct from what it reads and from its other
    outputs: refused before the first step, naming both, nothing written."""
    d = os.path.join(tmp, "same-files")
    os.makedirs(d)
    batches = os.path.basename(small_batches(d, 1))
    prog = keep_program(dmc, d, "k1", [MLP] + SMALL, ["--batch-file", batches, "--steps", "0", "--quiet"])
    if not prog:
        return

    def trainer(program, args):
        return subprocess.run([program, "--quiet"] + args, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=600)

    made = [trainer(prog, ["--batch-file", batches, "--steps", "0", "--save", "w1.st"]),
            trainer(prog, ["--batch-file", batches, "--steps", "2", "--checkpoint", "ck2"])]
    check(all(r.returncode == 0 for r in made), "the weights and the checkpoint the cases read (%s)"
          % " ".join(r.stderr.strip()[-200:] for r in made))
    os.symlink("w1.st", os.path.join(d, "w1-link.st"))
    with open(os.path.join(d, "corpus.txt"), "w") as f:
        f.write("the quick brown fox jumps over the lazy dog\n" * 20)
    ck = "ck2/step-00000002.safetensors"
    b = ["--batch-file", batches]
    cases = [
        (prog, b + ["--init", "w1.st", "--steps", "1", "--dump-grads", "w1.st"],
         "--dump-grads w1.st is the --init file w1.st: the gradients would replace the weights (give --dump-grads "
         "another file)", ["w1.st"]),
        (prog, b + ["--steps", "1", "--save", batches],
         "--save %s is the --batch-file %s: the trained weights would replace the inputs" % (batches, batches), [batches]),
        (prog, b + ["--init", "w1.st", "--steps", "1", "--save", "w1-link.st"],
         "--save w1-link.st is the --init file w1.st: the trained weights would replace the weights", ["w1.st"]),
        (prog, b + ["--init", "./w1.st", "--steps", "1", "--save", "w1.st"],
         "--save w1.st is the --init file ./w1.st", ["w1.st"]),
        (prog, b + ["--steps", "3", "--resume", "ck2", "--save", ck],
         "--save %s is the --resume checkpoint %s: the trained weights would replace the checkpoint" % (ck, ck), [ck]),
        (prog, b + ["--steps", "1", "--save", "g.st", "--dump-grads", "./g.st"],
         "--dump-grads ./g.st is the --save file g.st: the gradients and the trained weights would go to one file", ["g.st"]),
        (prog, b + ["--steps", "2", "--checkpoint", "ck3", "--save", "ck3/step-00000002.safetensors"],
         "--save ck3/step-00000002.safetensors is a checkpoint's name in --checkpoint ck3", ["ck3/step-00000002.safetensors"]),
    ]
    # (the small gpt outside_the_steps built, when it did: a compile less)
    lm = os.path.join(tmp, "lm", "gpt")
    if not os.path.exists(lm):
        lm = keep_program(dmc, d, "k2", [GPT, "--set", "V=256,T=8,C=16,NH=2,L=1,B=2"],
                          ["--steps", "0", "--sample", "1", "--quiet"])
    if lm:
        cases.append((lm, ["--data", "text:w1.st,corpus.txt", "--steps", "1", "--save", "corpus.txt"],
                      "--save corpus.txt is a --data text: file corpus.txt: the trained weights would replace the corpus",
                      ["corpus.txt"]))
    quantized = keep_program(dmc, d, "k3", [MLP] + SMALL + ["--quantize", "int8-weights"],
                             ["--init", "w1.st", "--save-quantized", "q.st", "--quiet"])
    if quantized:
        cases.append((quantized, ["--init", "w1.st", "--save-quantized", "w1.st"],
                      "--save-quantized w1.st is the --init file w1.st: the quantized weights would replace the "
                      "weights", ["w1.st"]))
    for program, args, want, kept in cases:
        small_batches(d, 1)  # (again: a case that failed wrote over it)
        before = contents(d, kept)
        r = trainer(program, args)
        check(r.returncode == 1 and want in r.stderr and "step 1" not in r.stdout and contents(d, kept) == before,
              "%s: refused before the first step, the files as they were (exit %d, %s)"
              % (" ".join(args), r.returncode, r.stderr.strip()[-300:]))


def trace_failure_keeps_save(dmc, tmp):
    """--trace's picture: tried before training (a directory there is refused at once); one
    that fails after training still leaves --save written (the trace is written after it)."""
    d = os.path.join(tmp, "trace-save")
    os.makedirs(d)
    batches = os.path.basename(small_batches(d, 1))
    prog = keep_program(dmc, d, "k", [MLP] + SMALL + ["--mesh", "pipeline=2"], ["--batch-file", batches, "--steps", "0",
                                                                                  "--quiet"])
    if not prog:
        return
    os.makedirs(os.path.join(d, "t.svg"))
    r = subprocess.run([prog, "--quiet", "--batch-file", batches, "--steps", "2", "--trace", "t.json", "--save", "w.st"],
                       cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    check(r.returncode == 1 and "--trace t.json: its picture t.svg: cannot write there: it is a directory" in r.stderr
          and "step 1" not in r.stdout and not os.path.exists(os.path.join(d, "w.st")),
          "a --trace whose picture is a directory: refused before training (exit %d, %s)"
          % (r.returncode, r.stderr.strip()[-240:]))
    # the picture's path becomes a directory during training (after the probes): the steps'
    # lines (2500 of about 45 bytes) overfill the pipe, so the run cannot end before the
    # directory is made
    p = subprocess.Popen([prog, "--quiet", "--batch-file", batches, "--steps", "2500", "--trace", "u.json", "--save",
                          "w.st"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    for line in p.stdout:
        if line.startswith("step 1 "):
            break
    os.makedirs(os.path.join(d, "u.svg"))
    out, err = p.communicate(timeout=600)
    saved = os.path.join(d, "w.st")
    check(p.returncode == 1 and "cannot write u.svg" in err and "(--save w.st was written)" in err
          and os.path.exists(saved) and "fc1.weight" in read_safetensors(saved),
          "a --trace picture that fails after training: --save is written, exit 1 naming both (exit %d, %s)"
          % (p.returncode, err.strip()[-240:]))


def main():
    dmc = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="dmc-guards-") as tmp:
        diverging(dmc, tmp)
        nan_input(dmc, tmp)
        unwritable_save(dmc, tmp)
        save_is_directory(dmc, tmp)
        save_through_link(dmc, tmp)
        overflowing_update(dmc, tmp)
        nan_in_init(dmc, tmp)
        final_checkpoint_disk_full(dmc, tmp)
        stopped_by(dmc, tmp, signal.SIGTERM, [])
        stopped_by(dmc, tmp, signal.SIGINT, ["--mesh", "data=2"])
        outside_the_steps(dmc, tmp)
        outputs_over_inputs(dmc, tmp)
        trace_failure_keeps_save(dmc, tmp)
    print("%d failed" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
