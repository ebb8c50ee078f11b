#!/usr/bin/env python3
"""test_checkpoint.py DMC: the trainer's checkpoints and --resume (docs/trainer.md, "Checkpoints").

The model is examples/mlp.dm made small, with what a resume must restore besides the
parameters: AdamW's state and bias correction (the step), a warmup + cosine schedule over the
run's steps, clipping, and dropout (its masks are keyed by seed and step). The data is a
Fashion-MNIST-shaped set of 4 batches written here, so that 10 steps cross two epoch
boundaries and a resume at step 5 starts inside the second epoch (its shuffle replayed).
Oracle: the same program run straight.

  - 10 steps straight and 5 + --resume + 5 give bitwise-identical weights (--save) and the
    same loss lines for steps 6-10: serial, data=2 x tensor=2, pipeline=2 (2 micro-batches),
    data=2 with ZeRO 1 (the optimizer state in shares) and ZeRO 3, and interleaved 1F1B
    (data=2 x pipeline=2, 2 chunks, with clipping and ZeRO 2: each chunk's shares);
  - a checkpoint of one mesh loads on every other: resumed with no step left and written
    again there, its tensors are those of the file it came from (every layout's gather and
    scatter of parameters and optimizer state);
  - --checkpoint-every writes every N steps and at the end, --checkpoint-keep K keeps the
    newest K, and SIGTERM writes the checkpoint of the step it stopped after, from which the
    run resumes to the straight run's weights;
  - failures: --resume of an empty directory, of a truncated file, of a weights file, of
    another model's checkpoint; a different --seed; an unwritable --checkpoint; options
    that need --checkpoint, or that exclude --resume. Each is an error naming what is wrong,
    before the first step;
  - issue 34 (nothing lost): one run per checkpoint directory (another run refused before
    its first step, the first run's files untouched; a resumed run keeps its trainer.run and
    prunes only its own, and is refused where the directory holds its checkpoints of steps
    after the one it resumes from; --resume of a directory of two runs; directories of checkpoints
    without a run); the data (trainer.data_hash: another batch file, other fashion-mnist
    files, a text corpus's files in another order refused, the same data resumed bitwise);
    checksums (every tensor's dmc.crc32c.<name> against a Python CRC-32C; a flipped bit
    refused by --resume and --init; a format 1 file still resumes);
  - one run at a time per directory: a run holds DIR/.lock (flock) from its start to its
    end, so a second run started before the first's first checkpoint is refused, naming
    DIR (it used to pass the check of checkpoints and then replace the first's); the ranks
    of one run do not refuse each other (every mesh above, and MPI below, write
    checkpoints); the lock of a killed run holds nothing; the lock file goes at the end;
  - a killed checkpoint write's temporary file (step-<N>.safetensors.tmp.XXXXXX) is removed
    by the next run into the directory, which says so; other files stay;
  - --save files carry dmc.crc32c.<name> too, and --init checks them (a flipped bit used to
    load silently); --save over a Fashion-MNIST file of --data-dir is refused;
  - ranks that would continue from different steps (each reads its own --resume: on
    several hosts a DIR's newest may differ): refused before the first step, naming both
    steps (MPI, one rank given step 5's checkpoint and the other step 10's; skipped
    without mpirun).
Prints one line per check; exits 1 on any failure.
"""
import gzip
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, BATCHES, TEST = 32, 4, 64
failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures += 1


def small_mlp(tmp):
    with open(os.path.join(ROOT, "examples", "mlp.dm")) as f:
        src = f.read()
    src = re.sub(r"^dim B = \d+", "dim B = %d" % BATCH, src, flags=re.M)
    src = re.sub(r"^dim H = \d+", "dim H = 64", src, flags=re.M)
    src = src.replace("h1 = relu(fc1(xn))", "h1 = dropout(relu(fc1(xn)), 0.1)")
    src = re.sub(r"optimizer \w+\([^)]*\)",
                 "optimizer adamw(lr = 1e-2, weight_decay = 1e-4, warmup = 3, decay = cosine, min_lr = 1e-3, clip = 1.0)",
                 src)
    path = os.path.join(tmp, "small.dm")
    with open(path, "w") as f:
        f.write(src)
    return path


def write_idx(path, magic_dims, data):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic_dims[0]))
        for d in magic_dims[1:]:
            f.write(struct.pack(">I", d))
        f.write(bytes(data))


def fashion_like(tmp):
    """A data directory in fashion-mnist's format: BATCHES batches to train on, TEST to test."""
    rng = random.Random(7)
    d = os.path.join(tmp, "data")
    os.makedirs(d)
    for prefix, n in (("train", BATCH * BATCHES), ("t10k", TEST)):
        labels = [rng.randrange(10) for _ in range(n)]
        # images that depend on the label, so that training does something
        pixels = [min(255, rng.randrange(128) + 12 * labels[i] * (p % 7 == labels[i] % 7))
                  for i in range(n) for p in range(784)]
        write_idx(os.path.join(d, prefix + "-images-idx3-ubyte.gz"), [0x803, n, 28, 28], pixels)
        write_idx(os.path.join(d, prefix + "-labels-idx1-ubyte.gz"), [0x801, n], labels)
    return d


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), and the metadata."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}, meta


class Trainer:
    """One compiled program of the small model on one mesh (dmc run --keep), run directly."""

    def __init__(self, dmc, model, tmp, data, mesh, name=None):
        self.name = name or " ".join(mesh) or "serial"
        self.dir = os.path.join(tmp, "build-" + re.sub(r"\W+", "_", self.name))
        r = subprocess.run([dmc, "run", model] + mesh + ["--keep", self.dir, "--", "--steps", "0", "--quiet",
                            "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=600)
        if r.returncode != 0:
            sys.exit("compiling %s failed: %s" % (self.name, r.stderr))
        self.exe = os.path.join(self.dir, "small")
        self.data, self.tmp = data, tmp

    def run(self, args, timeout=600, data_dir=True):
        return subprocess.run([self.exe, "--quiet"] + (["--data-dir", self.data] if data_dir else []) + args, cwd=self.tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=timeout)


def loss_lines(out, first):
    return [l for l in out.splitlines() if re.match(r"step (\d+) loss", l) and int(l.split()[1]) >= first]


def strip_ms(lines):
    return [re.sub(r" ms [\d.]+", "", l) for l in lines]


def straight_vs_resumed(t, tmp):
    tag = re.sub(r"\W+", "_", t.name)
    straight, resumed = os.path.join(tmp, tag + "-straight.st"), os.path.join(tmp, tag + "-resumed.st")
    ckpt = os.path.join(tmp, tag + "-ckpt")
    a = t.run(["--steps", "10", "--save", straight])
    # the run resumed is one of 10 steps (its schedule spans 10) that left a checkpoint at 5
    b1 = t.run(["--steps", "10", "--checkpoint", ckpt, "--checkpoint-every", "5"])
    at5 = os.path.join(ckpt, "step-00000005.safetensors")
    b2 = t.run(["--steps", "10", "--resume", at5, "--save", resumed])
    ok = a.returncode == 0 and b1.returncode == 0 and b2.returncode == 0
    check(ok, "%s: 10 steps, and 5 + --resume + 5, run (%s)" % (t.name, (a.stderr + b1.stderr + b2.stderr).strip()[-300:]))
    if not ok:
        return None
    same = open(straight, "rb").read() == open(resumed, "rb").read()
    check(same, "%s: 5 + --resume + 5 gives the weights of 10 straight, bitwise" % t.name)
    la, lb = strip_ms(loss_lines(a.stdout, 6)), strip_ms(loss_lines(b2.stdout, 1))
    check(len(la) == 5 and la == lb, "%s: the resumed run prints steps 6-10 as the straight run (%s vs %s)"
          % (t.name, la[:1], lb[:1]))
    check("test accuracy" in b2.stdout and re.search(r"^epoch 2 test accuracy", b2.stdout, re.M) is not None,
          "%s: the resumed run finishes epoch 2 and evaluates it" % t.name)
    return at5


def cross_mesh(trainers, source, tmp):
    """source: a checkpoint of step 5 of some mesh; every mesh loads it and writes it again."""
    want, want_meta = read_safetensors(source)
    for t in trainers:
        # a directory per source: a checkpoint directory holds one run's checkpoints
        out = os.path.join(tmp, "again-" + re.sub(r"\W+", "_", t.name) + "-from-" + os.path.basename(os.path.dirname(source)))
        r = t.run(["--steps", "5", "--resume", source, "--checkpoint", out])
        again = os.path.join(out, "step-00000005.safetensors")
        if r.returncode != 0 or not os.path.exists(again):
            check(False, "%s loads a checkpoint of another mesh (%s)" % (t.name, r.stderr.strip()[-300:]))
            continue
        got, meta = read_safetensors(again)
        check(got == want and meta.get("dmc.step") == "5" and meta.get("trainer.seed") == want_meta.get("trainer.seed"),
              "%s loads the checkpoint of another mesh and writes back the same %d tensors (parameters and "
              "optimizer state)" % (t.name, len(want)))


def every_and_keep(t, tmp):
    d = os.path.join(tmp, "every")
    r = t.run(["--steps", "7", "--checkpoint", d, "--checkpoint-every", "2", "--checkpoint-keep", "2"])
    said = re.findall(r"^checkpoint (\d+) ", r.stdout, re.M)
    check(r.returncode == 0 and said == ["2", "4", "6", "7"],
          "--checkpoint-every 2 over 7 steps writes after steps 2, 4, 6 and at the end (%s)" % said)
    check(sorted(os.listdir(d)) == ["step-00000006.safetensors", "step-00000007.safetensors"],
          "--checkpoint-keep 2 keeps the newest two (%s)" % sorted(os.listdir(d)))


def long_run(t, tmp, directory, until_step, stderr=subprocess.PIPE):
    """A run of 100000 steps into --checkpoint directory, started and read up to its line of
    step until_step (it runs on)."""
    p = subprocess.Popen([t.exe, "--quiet", "--data-dir", t.data, "--steps", "100000", "--checkpoint", directory],
                         cwd=tmp, stdout=subprocess.PIPE, stderr=stderr, universal_newlines=True)
    for line in p.stdout:
        if line.startswith("step %d " % until_step):
            break
    return p


def terminated(p):
    """p stopped by SIGTERM (killed when it does not end within a minute): its (stdout, stderr)."""
    p.send_signal(signal.SIGTERM)
    try:
        return p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.communicate()


def stopped_and_resumed(t, tmp):
    """SIGTERM with --checkpoint: the stop's checkpoint resumes to the straight run's weights. t's
    model has no decay, so that a run's length does not change its steps."""
    d = os.path.join(tmp, "stopped")
    p = long_run(t, tmp, d, 2)
    out, err = terminated(p)
    said = re.search(r"stopped by a signal after step (\d+) of 100000.*the checkpoint of that step was written", err)
    ckpts = sorted(os.listdir(d)) if os.path.isdir(d) else []
    check(p.returncode == 128 + signal.SIGTERM and said is not None and ckpts == ["step-%08d.safetensors" % int(said.group(1))],
          "SIGTERM with --checkpoint: stops at a step boundary and writes that step's checkpoint (exit %s, %s; %s)"
          % (p.returncode, ckpts, err.strip()[-200:]))
    if not said:
        return
    steps = str(int(said.group(1)) + 3)
    resumed, straight = os.path.join(tmp, "stop-resumed.st"), os.path.join(tmp, "stop-straight.st")
    r = t.run(["--steps", steps, "--resume", d, "--save", resumed])
    s = t.run(["--steps", steps, "--save", straight])
    check(r.returncode == 0 and s.returncode == 0 and open(resumed, "rb").read() == open(straight, "rb").read(),
          "resumed from the stop's checkpoint for 3 more steps: the weights of %s steps straight, bitwise" % steps)


def failure_cases(t, tmp, ckpt):
    def refused(args, pattern, what, status=1):
        r = t.run(args)
        check(r.returncode == status and re.search(pattern, r.stderr) is not None and "step 1 " not in r.stdout,
              "%s: exit %d, before the first step (%s)" % (what, status, r.stderr.strip()[-240:]))

    empty = os.path.join(tmp, "empty-dir")
    os.makedirs(empty)
    refused(["--steps", "2", "--resume", empty], re.escape(empty) + r": no checkpoint in the directory",
            "--resume of an empty directory")
    # a FIFO of a checkpoint's name is never opened (opening it waited for a writer forever)
    fifo_dir = os.path.join(tmp, "fifo-dir")
    os.makedirs(fifo_dir)
    os.mkfifo(os.path.join(fifo_dir, "step-00000005.safetensors"))
    for args, what in ((["--steps", "2", "--resume", fifo_dir], "--resume of a directory whose newest is a FIFO"),
                       (["--steps", "2", "--checkpoint", fifo_dir], "--checkpoint into a directory holding a FIFO")):
        try:
            r = t.run(args, timeout=60)
            check(r.returncode == 1 and "step-00000005.safetensors: not a regular file" in r.stderr,
                  "%s: exit %d, naming it (%s)" % (what, r.returncode, r.stderr.strip()[-240:]))
        except subprocess.TimeoutExpired:
            check(False, "%s: still waiting after 60 s" % what)
    # only the trainer's own names are checkpoints: step-3.safetensors is neither read nor
    # pruned as step-00000003.safetensors
    named = os.path.join(tmp, "named-dir")
    os.makedirs(named)
    shutil.copy(ckpt, os.path.join(named, "step-3.safetensors"))
    refused(["--steps", "2", "--resume", named], re.escape(named) + r": no checkpoint in the directory",
            "--resume of a directory whose only file is step-3.safetensors (not a name the trainer writes)")
    truncated = os.path.join(tmp, "truncated.safetensors")
    with open(ckpt, "rb") as f:
        blob = f.read()
    with open(truncated, "wb") as f:
        f.write(blob[:len(blob) // 2])
    refused(["--steps", "2", "--resume", truncated], re.escape(truncated) + r": tensor '[\w.]+': data_offsets .* out of range",
            "--resume of a truncated checkpoint")
    weights = os.path.join(tmp, "weights.safetensors")
    t.run(["--steps", "1", "--save", weights])
    refused(["--steps", "2", "--resume", weights], r"not a checkpoint .*--init", "--resume of a weights file")
    other = os.path.join(tmp, "other.safetensors")
    tensors, meta = read_safetensors(ckpt)
    write_safetensors(other, {k: v for k, v in tensors.items() if not k.endswith(".exp_avg_sq")}, meta)
    refused(["--steps", "2", "--resume", other], r"optimizer state 'fc1.weight.exp_avg_sq' .* is missing",
            "--resume of a checkpoint without AdamW's second moments (another optimizer's)")
    refused(["--steps", "7", "--resume", ckpt, "--seed", "3"], r"--seed 3, but checkpoint .* seed 0", "--resume with another --seed", 2)
    refused(["--steps", "2", "--resume", ckpt, "--init", weights], r"cannot be combined with --init", "--resume with --init", 2)
    refused(["--steps", "2", "--checkpoint-every", "1"], r"--checkpoint-every only applies with --checkpoint",
            "--checkpoint-every without --checkpoint", 2)
    # a checkpoint past the run's last step has no step left: it is said so at once, without
    # replaying the data of 10^15 steps first (which never ended)
    far = os.path.join(tmp, "far.safetensors")
    tensors, meta = read_safetensors(ckpt)
    write_safetensors(far, tensors, dict(meta, **{"dmc.step": "1000000000000000"}))
    try:
        r = t.run(["--steps", "2", "--resume", far], timeout=60)
        check(r.returncode == 0 and "step " not in r.stdout,
              "--resume from step 10^15 with --steps 2: no step left, at once (exit %d, %s)"
              % (r.returncode, (r.stderr + r.stdout).strip()[-200:]))
    except subprocess.TimeoutExpired:
        check(False, "--resume from step 10^15 with --steps 2 still running after 60 s")
    for bad in ("-1", " 5", "+5", "12junk", "9223372036854775807"):
        write_safetensors(far, tensors, dict(meta, **{"dmc.step": bad}))
        refused(["--steps", "2", "--resume", far], r'metadata "dmc.step" is \'%s\', not a count of updates' % re.escape(bad),
                "--resume of a checkpoint whose dmc.step is '%s'" % bad)
    blocker = os.path.join(tmp, "a-file")
    open(blocker, "w").close()
    refused(["--steps", "2", "--checkpoint", os.path.join(blocker, "sub")], r"--checkpoint .*cannot create the directory",
            "--checkpoint under a file")


def refused_run(r, pattern, what, status=1):
    check(r.returncode == status and re.search(pattern, r.stderr) is not None and "step 1 " not in r.stdout
          and not re.search(r"^step \d+ loss", r.stdout, re.M),
          "%s: exit %d, before the first step (%s)" % (what, status, r.stderr.strip()[-300:]))


def snapshot(d):
    """name -> bytes of every file of directory d."""
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def one_run_per_directory(t, tmp):
    """Issue 34 item 2: a run does not write into, nor prune, a directory of another run's
    checkpoints; a resumed run keeps its checkpoint's run and prunes its own files."""
    d = os.path.join(tmp, "one-run")
    r1 = t.run(["--steps", "8", "--checkpoint", d])
    before = snapshot(d) if os.path.isdir(d) else {}
    run1 = read_safetensors(os.path.join(d, "step-00000008.safetensors"))[1].get("trainer.run", "") if before else ""
    check(r1.returncode == 0 and list(before) == ["step-00000008.safetensors"] and re.fullmatch(r"[0-9a-f]{16}", run1),
          "a fresh run's checkpoint names its run: trainer.run %r (%s)" % (run1, r1.stderr.strip()[-200:]))
    r2 = t.run(["--seed", "1", "--steps", "4", "--checkpoint", d, "--checkpoint-every", "2", "--checkpoint-keep", "1"])
    refused_run(r2, r"--checkpoint %s holds checkpoints of another run \(the newest: %s of run %s\).*another directory, "
                r"or continue that run with --resume" % (re.escape(d), re.escape(os.path.join(d, "step-00000008.safetensors")), run1),
                "another run into a directory of checkpoints (--checkpoint-keep 1)")
    check(snapshot(d) == before, "the other run's checkpoints are as they were (%s)" % sorted(os.listdir(d)))
    # the same step numbers would have replaced the other run's files
    refused_run(t.run(["--seed", "1", "--steps", "8", "--checkpoint", d]), r"holds checkpoints of another run",
                "another run that would write the same step into the directory")
    # resumed: the same run, which may write there and prunes its own older files
    r3 = t.run(["--resume", d, "--steps", "12", "--checkpoint", d, "--checkpoint-every", "2", "--checkpoint-keep", "2"])
    said = re.findall(r"^checkpoint (\d+) ", r3.stdout, re.M)
    left = sorted(os.listdir(d))
    runs = {read_safetensors(os.path.join(d, n))[1].get("trainer.run") for n in left}
    check(r3.returncode == 0 and said == ["10", "12"] and left == ["step-00000010.safetensors", "step-00000012.safetensors"]
          and runs == {run1}, "a run resumed from its directory keeps its run and prunes its own checkpoints (%s, %s, %s; %s)"
          % (said, left, runs, r3.stderr.strip()[-200:]))
    # resumed from an older checkpoint of its own into the directory holding its later ones:
    # refused (its new checkpoints would be a second history, pruned first by
    # --checkpoint-keep, passed over by --resume DIR), the files as they were
    kept = snapshot(d)
    refused_run(t.run(["--resume", os.path.join(d, "step-00000010.safetensors"), "--steps", "11", "--checkpoint", d,
                       "--checkpoint-keep", "1"]),
                r"--checkpoint %s holds this run's checkpoints after step 10, the one it resumes from \(the newest: "
                r"%s of run %s\)" % (re.escape(d), re.escape(os.path.join(d, "step-00000012.safetensors")), run1),
                "a run resumed from its older checkpoint into the directory of its later ones")
    check(snapshot(d) == kept, "the later checkpoints are as they were (%s)" % sorted(os.listdir(d)))
    # a directory of two runs' checkpoints (put there by hand): --resume DIR does not choose
    other = os.path.join(tmp, "other-run")
    t.run(["--seed", "1", "--steps", "3", "--checkpoint", other])
    mixed = os.path.join(tmp, "mixed-runs")
    shutil.copytree(d, mixed)
    shutil.copy(os.path.join(other, "step-00000003.safetensors"), mixed)
    refused_run(t.run(["--resume", mixed, "--steps", "14"]),
                r"%s: the directory holds the checkpoints of 2 runs .*step-00000012.safetensors of run %s.*"
                r"step-00000003.safetensors of run [0-9a-f]{16}.*name the checkpoint file" % (re.escape(mixed), run1),
                "--resume of a directory with the checkpoints of two runs")
    r4 = t.run(["--resume", os.path.join(mixed, "step-00000003.safetensors"), "--steps", "4"])
    check(r4.returncode == 0, "--resume of one file of that directory (%s)" % r4.stderr.strip()[-200:])
    # a directory of checkpoints written before they named their run: refused too
    legacy = os.path.join(tmp, "legacy-run")
    os.makedirs(legacy)
    tensors, meta = read_safetensors(os.path.join(other, "step-00000003.safetensors"))
    meta.pop("trainer.run", None)
    write_safetensors(os.path.join(legacy, "step-00000003.safetensors"), tensors, meta)
    refused_run(t.run(["--steps", "4", "--checkpoint", legacy]),
                r"holds checkpoints of another run \(the newest: .*step-00000003.safetensors, of no named run",
                "a run into a directory of checkpoints without a run")
    # ... unless this run continues them: it has no run either, and they are its own
    r5 = t.run(["--resume", legacy, "--steps", "5", "--checkpoint", legacy, "--checkpoint-keep", "1"])
    left = sorted(os.listdir(legacy))
    check(r5.returncode == 0 and left == ["step-00000005.safetensors"]
          and "trainer.run" not in read_safetensors(os.path.join(legacy, left[0]))[1],
          "a run resumed from a checkpoint without a run has none, writes beside it and prunes it (%s; %s)"
          % (left, r5.stderr.strip()[-200:]))
    # ... but not into another directory's checkpoints without a run
    legacy2 = os.path.join(tmp, "legacy-run-2")
    shutil.copytree(legacy, legacy2)
    refused_run(t.run(["--resume", os.path.join(other, "step-00000003.safetensors"), "--steps", "4", "--checkpoint", legacy2]),
                r"holds checkpoints of another run", "a resumed run into the directory of another run's checkpoints")
    refused_run(t.run(["--resume", os.path.join(legacy, "step-00000005.safetensors"), "--steps", "6", "--checkpoint",
                       legacy2]), r"holds checkpoints of another run \(the newest: .*legacy-run-2/step-00000005.safetensors, of no",
                "a run resumed from a checkpoint without a run, into another directory of checkpoints without a run")


def directory_in_use(t, tmp):
    """Two runs into one directory at once: the second is refused while the first holds it,
    even before the first has written a checkpoint; a killed run's lock holds nothing."""
    d = os.path.join(tmp, "in-use")
    p = long_run(t, tmp, d, 1)
    second = t.run(["--steps", "4", "--checkpoint", d])
    refused_run(second, r"--checkpoint %s is in use by another run \(pid %d" % (re.escape(d), p.pid),
                "a second run into a directory a running run holds, before its first checkpoint")
    out, err = terminated(p)
    said = re.search(r"stopped by a signal after step (\d+)", err)
    left = sorted(os.listdir(d)) if os.path.isdir(d) else []
    run = read_safetensors(os.path.join(d, left[0]))[1].get("trainer.run") if len(left) == 1 else None
    check(p.returncode == 128 + signal.SIGTERM and said is not None and left == ["step-%08d.safetensors" % int(said.group(1))]
          and run is not None, "the first run's checkpoint alone is left, and no lock file (%s; %s)" % (left, err.strip()[-200:]))
    # a run killed outright leaves its lock file, which holds nothing
    killed = os.path.join(tmp, "killed")
    p = long_run(t, tmp, killed, 1, stderr=subprocess.DEVNULL)
    p.kill()
    p.communicate()
    r = t.run(["--steps", "2", "--checkpoint", killed])
    check(r.returncode == 0 and sorted(os.listdir(killed)) == ["step-00000002.safetensors"],
          "a run into the directory of a killed one (its lock file left) runs, and removes it (%s; %s)"
          % (sorted(os.listdir(killed)), r.stderr.strip()[-200:]))


def unfinished_writes(t, tmp):
    """A checkpoint write killed before its rename leaves step-<N>.safetensors.tmp.XXXXXX; the
    next run into the directory removes those (no other run can be writing there: it holds
    the lock) and says so; any other file stays."""
    d = os.path.join(tmp, "unfinished")
    os.makedirs(d)
    orphans = ["step-00000003.safetensors.tmp.Ab12Cd", "step-00000004.safetensors.tmp.xY9z0Q"]
    others = ["notes.txt", "step-3.safetensors.tmp.Ab12Cd", "step-00000003.safetensors.tmp", "w.st.tmp.Ab12Cd"]
    for n in orphans + others:
        with open(os.path.join(d, n), "w") as f:
            f.write("half a checkpoint")
    r = t.run(["--steps", "2", "--checkpoint", d])
    left = sorted(os.listdir(d))
    check(r.returncode == 0 and left == sorted(others + ["step-00000002.safetensors"])
          and re.search(r"--checkpoint %s: removed 2 unfinished checkpoint files \(%s, %s\)" %
                        (re.escape(d), re.escape(orphans[0]), re.escape(orphans[1])), r.stderr) is not None,
          "a run removes the directory's unfinished checkpoint files, says so, and keeps the others (%s; %s)"
          % (left, r.stderr.strip()[-240:]))


def save_distinct_from_data(t, tmp):
    """--save over a file of the Fashion-MNIST directory the run reads: refused, the file kept."""
    copy = os.path.join(tmp, "data-save")
    shutil.copytree(t.data, copy)
    target = os.path.join(copy, "t10k-labels-idx1-ubyte.gz")
    before = open(target, "rb").read()
    refused_run(subprocess.run([t.exe, "--quiet", "--data-dir", copy, "--steps", "1", "--save", target], cwd=tmp,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600),
                r"--save %s is the --data-dir file %s: the trained weights would replace the data set"
                % (re.escape(target), re.escape(target)), "--save over a file of --data-dir")
    check(open(target, "rb").read() == before, "the Fashion-MNIST file is as it was")


def batch_file(path, seed, steps=2):
    rng = random.Random(seed)
    labels = [rng.randrange(10) for _ in range(steps * BATCH)]
    xs = struct.pack("<%df" % (steps * BATCH * 784), *[rng.random() * (1 + labels[i // 784] * (i % 7 == 0))
                                                       for i in range(steps * BATCH * 784)])
    write_safetensors(path, {"x": ("F32", [steps, BATCH, 784], xs),
                             "y": ("I32", [steps, BATCH], struct.pack("<%di" % len(labels), *labels))}, {})


def same_data(t, tmp):
    """Issue 34 item 6: --resume on other data (another batch file, other fashion-mnist files)
    is refused; on the same data the resume is bitwise that of the straight run."""
    b1, b2 = os.path.join(tmp, "b1.safetensors"), os.path.join(tmp, "b2.safetensors")
    batch_file(b1, 1)
    batch_file(b2, 2)
    d = os.path.join(tmp, "bf-ckpt")
    straight, resumed = os.path.join(tmp, "bf-straight.st"), os.path.join(tmp, "bf-resumed.st")
    a = t.run(["--batch-file", b1, "--steps", "4", "--save", straight], data_dir=False)
    b = t.run(["--batch-file", b1, "--steps", "4", "--checkpoint", d, "--checkpoint-every", "2"], data_dir=False)
    at2 = os.path.join(d, "step-00000002.safetensors")
    meta = read_safetensors(at2)[1] if os.path.exists(at2) else {}
    check(a.returncode == 0 and b.returncode == 0 and re.fullmatch(r"[0-9a-f]{16}", meta.get("trainer.data_hash", ""))
          and meta.get("trainer.data_source") == b1,
          "a checkpoint records its data: trainer.data_hash %r, trainer.data_source %r" %
          (meta.get("trainer.data_hash"), meta.get("trainer.data_source")))
    refused_run(t.run(["--batch-file", b2, "--steps", "4", "--resume", at2], data_dir=False),
                r"checkpoint %s was trained on other data \(batch-file %s, hash [0-9a-f]{16}\), this run's \(batch-file "
                r"%s, hash [0-9a-f]{16}\) differs: .*--init" % (re.escape(at2), re.escape(b1), re.escape(b2)),
                "--resume with another batch file")
    c = t.run(["--batch-file", b1, "--steps", "4", "--resume", at2, "--save", resumed], data_dir=False)
    check(c.returncode == 0 and open(straight, "rb").read() == open(resumed, "rb").read(),
          "--resume with the same batch file: the weights of the straight run, bitwise (%s)" % c.stderr.strip()[-200:])
    # fashion-mnist files with other examples (the same shapes)
    other = os.path.join(tmp, "other-data")
    shutil.copytree(t.data, other)
    labels = os.path.join(other, "train-labels-idx1-ubyte.gz")
    with gzip.open(labels) as f:
        blob = bytearray(f.read())
    blob[8] = (blob[8] + 1) % 10
    with gzip.open(labels, "wb") as f:
        f.write(bytes(blob))
    ck = os.path.join(tmp, "fm-ckpt")
    t.run(["--steps", "2", "--checkpoint", ck])
    refused_run(subprocess.run([t.exe, "--quiet", "--data-dir", other, "--steps", "3", "--resume", ck], cwd=tmp,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600),
                r"trained on other data \(fashion-mnist %s, hash" % re.escape(t.data),
                "--resume on fashion-mnist files with another label")
    # a checkpoint from before checkpoints recorded their data: resumed, with a note
    old = os.path.join(tmp, "no-hash.safetensors")
    tensors, meta = read_safetensors(at2)
    for k in ("trainer.data_hash", "trainer.data_source"):
        meta.pop(k, None)
    write_safetensors(old, tensors, meta)
    r = t.run(["--batch-file", b2, "--steps", "3", "--resume", old], data_dir=False)
    check(r.returncode == 0 and "records no hash of its data" in r.stderr,
          "--resume of a checkpoint without trainer.data_hash: resumed with a note (%s)" % r.stderr.strip()[-200:])


def text_order(dmc, tmp):
    """Issue 34 item 6 for text: the corpus's files in another order are other data."""
    parts = []
    rng = random.Random(3)
    for i in range(2):
        p = os.path.join(tmp, "part%d.txt" % i)
        with open(p, "w") as f:
            f.write("".join(rng.choice("abcdefgh \n") for _ in range(3000)))
        parts.append(p)
    build = os.path.join(tmp, "build-gpt")
    r = subprocess.run([dmc, "run", os.path.join(ROOT, "examples", "gpt.dm"), "--set", "V=256,T=8,C=16,NH=2,L=1,B=2",
                        "--keep", build, "--", "--steps", "0", "--quiet", "--data", "text:" + ",".join(parts)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    if r.returncode != 0:
        check(False, "compiling a small gpt.dm (%s)" % r.stderr.strip()[-300:])
        return
    exe = os.path.join(build, "gpt")

    def run(args):
        return subprocess.run([exe, "--quiet"] + args, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=600)

    ab, ba = "text:" + ",".join(parts), "text:" + ",".join(reversed(parts))
    d = os.path.join(tmp, "text-ckpt")
    straight, resumed = os.path.join(tmp, "text-straight.st"), os.path.join(tmp, "text-resumed.st")
    a = run(["--data", ab, "--steps", "4", "--save", straight])
    b = run(["--data", ab, "--steps", "4", "--checkpoint", d, "--checkpoint-every", "2"])
    at2 = os.path.join(d, "step-00000002.safetensors")
    check(a.returncode == 0 and b.returncode == 0, "gpt.dm on a text corpus of two files (%s)" % (a.stderr + b.stderr)[-200:])
    refused_run(run(["--data", ba, "--steps", "4", "--resume", at2]),
                r"trained on other data \(text %s, hash .*this run's \(text %s, hash" % (re.escape(ab[5:]), re.escape(ba[5:])),
                "--resume on the corpus's files in another order")
    c = run(["--data", ab, "--steps", "4", "--resume", at2, "--save", resumed])
    check(c.returncode == 0 and open(straight, "rb").read() == open(resumed, "rb").read(),
          "--resume on the same corpus: the weights of the straight run, bitwise (%s)" % c.stderr.strip()[-200:])


CRC_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    CRC_TABLE.append(_c)


def crc32c(data):
    """CRC-32C (Castagnoli), bit-reflected, the reference the trainer's is checked against."""
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ CRC_TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def flip_bit(src, dst, tensor, byte=5, bit=3):
    """dst: src with one bit of tensor's data flipped (in place in the file's bytes)."""
    with open(src, "rb") as f:
        blob = bytearray(f.read())
    n = struct.unpack("<Q", blob[:8])[0]
    begin = json.loads(blob[8:8 + n])[tensor]["data_offsets"][0]
    blob[8 + n + begin + byte] ^= 1 << bit
    with open(dst, "wb") as f:
        f.write(bytes(blob))


def checksums(t, tmp, ckpt):
    """Issue 34 item 9: every tensor of a checkpoint has its CRC-32C, checked on --resume and --init."""
    check(crc32c(b"123456789") == 0xE3069283, "the test's CRC-32C gives the standard check value")
    tensors, meta = read_safetensors(ckpt)
    bad = [k for k, v in tensors.items() if meta.get("dmc.crc32c." + k) != "%08x" % crc32c(v[2])]
    check(meta.get("dmc.format") == "dmc checkpoint 2" and not bad,
          "format 'dmc checkpoint 2': every one of %d tensors has its CRC-32C in dmc.crc32c.<name> (wrong or missing: %s)"
          % (len(tensors), bad[:3]))
    flipped = os.path.join(tmp, "flipped.safetensors")
    flip_bit(ckpt, flipped, "fc1.weight.exp_avg")
    refused_run(t.run(["--steps", "7", "--resume", flipped]),
                r"%s: tensor 'fc1.weight.exp_avg' fails its CRC-32C check \(stored [0-9a-f]{8}, computed [0-9a-f]{8}\): "
                r"the file is corrupt" % re.escape(flipped), "--resume of a checkpoint with one bit flipped in a tensor")
    flipped_param = os.path.join(tmp, "flipped-param.safetensors")
    flip_bit(ckpt, flipped_param, "fc2.bias", byte=0, bit=0)
    refused_run(t.run(["--steps", "1", "--init", flipped_param]),
                r"%s: tensor 'fc2.bias' fails its CRC-32C check" % re.escape(flipped_param),
                "--init from a checkpoint with one bit flipped in a parameter")
    stripped = os.path.join(tmp, "stripped.safetensors")
    write_safetensors(stripped, tensors, {k: v for k, v in meta.items() if k != "dmc.crc32c.fc1.bias"})
    refused_run(t.run(["--steps", "7", "--resume", stripped]), r"tensor 'fc1.bias' has no CRC-32C",
                "--resume of a 'dmc checkpoint 2' without one tensor's CRC-32C")
    # format 1 (before checksums) still resumes
    old = os.path.join(tmp, "format1.safetensors")
    meta1 = {k: v for k, v in meta.items() if not k.startswith("dmc.crc32c.")}
    meta1["dmc.format"] = "dmc checkpoint 1"
    write_safetensors(old, tensors, meta1)
    r = t.run(["--steps", "7", "--resume", old])
    check(r.returncode == 0, "a 'dmc checkpoint 1' file (no checksums) still resumes (%s)" % r.stderr.strip()[-200:])
    # --save's files have them too, which --init checks
    saved = os.path.join(tmp, "crc-save.safetensors")
    r = t.run(["--steps", "1", "--save", saved])
    tensors, meta = read_safetensors(saved) if r.returncode == 0 else ({}, {})
    bad = [k for k, v in tensors.items() if meta.get("dmc.crc32c." + k) != "%08x" % crc32c(v[2])]
    check(r.returncode == 0 and tensors and not bad and "dmc.format" not in meta,
          "--save: every one of %d tensors has its CRC-32C in dmc.crc32c.<name> (wrong or missing: %s; %s)"
          % (len(tensors), bad[:3], r.stderr.strip()[-200:]))
    flipped_save = os.path.join(tmp, "flipped-save.safetensors")
    flip_bit(saved, flipped_save, "fc1.weight", byte=9, bit=1)
    refused_run(t.run(["--steps", "1", "--init", flipped_save]),
                r"%s: tensor 'fc1.weight' fails its CRC-32C check" % re.escape(flipped_save),
                "--init of a --save file with one bit flipped")


def ranks_resume_alike(dmc, model, tmp, data):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("skip  ranks resuming from different steps: no mpirun")
        return
    build = os.path.join(tmp, "build-mpi")
    r = subprocess.run([dmc, "run", model, "--mesh", "data=2", "--backend", "mpi", "--keep", build, "--", "--steps", "0",
                        "--quiet", "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=600)
    if r.returncode != 0:
        print("skip  ranks resuming from different steps: no MPI program (%s)" % r.stdout.strip()[-200:])
        return
    exe, ckpt = os.path.join(build, "small"), os.path.join(tmp, "mpi-ckpt")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    base = [mpirun, "--oversubscribe"]
    args = [exe, "--quiet", "--data-dir", data, "--steps", "12"]
    r = subprocess.run(base + ["-np", "2"] + args[:-1] + ["10", "--checkpoint", ckpt, "--checkpoint-every", "5"], cwd=tmp,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    check(r.returncode == 0, "MPI data=2: 10 steps with a checkpoint every 5 (%s)" % r.stdout.strip()[-200:])
    at5, at10 = (os.path.join(ckpt, "step-%08d.safetensors" % n) for n in (5, 10))
    r = subprocess.run(base + ["-np", "1"] + args + ["--resume", at5, ":", "-np", "1"] + args + ["--resume", at10],
                       cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                       timeout=300)
    check(r.returncode != 0 and "continues from step 5, rank 1 from step 10" in r.stdout
          and not re.search(r"^step \d+ loss", r.stdout, re.M),
          "MPI data=2: ranks given checkpoints of steps 5 and 10 are refused before a step (%s)"
          % r.stdout.strip()[:300])


def write_safetensors(path, tensors, meta):
    header, offset = {"__metadata__": meta}, 0
    for name, (dtype, shape, blob) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values()))


def main():
    dmc = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-ckpt-")
    try:
        model = small_mlp(tmp)
        data = fashion_like(tmp)
        meshes = [[], ["--mesh", "data=2,tensor=2"], ["--mesh", "pipeline=2", "--microbatches", "2"],
                  ["--mesh", "data=2", "--zero", "1"], ["--mesh", "data=2", "--zero", "3"]]
        trainers = [Trainer(dmc, model, tmp, data, m) for m in meshes]
        sources = [straight_vs_resumed(t, tmp) for t in trainers]
        if sources[1]:
            cross_mesh(trainers, sources[1], tmp)
        if sources[3]:
            cross_mesh(trainers[:1], sources[3], tmp)
        every_and_keep(trainers[0], tmp)
        if sources[0]:
            failure_cases(trainers[0], tmp, sources[0])
            checksums(trainers[0], tmp, sources[0])
        one_run_per_directory(trainers[0], tmp)
        directory_in_use(trainers[0], tmp)
        unfinished_writes(trainers[0], tmp)
        save_distinct_from_data(trainers[0], tmp)
        ranks_resume_alike(dmc, model, tmp, data)
        same_data(trainers[0], tmp)
        text_order(dmc, tmp)
        with open(model) as f:
            constant = f.read().replace(", warmup = 3, decay = cosine, min_lr = 1e-3", "")
        model_constant = os.path.join(tmp, "constant", "small.dm")
        os.makedirs(os.path.dirname(model_constant))
        with open(model_constant, "w") as f:
            f.write(constant)
        stopped_and_resumed(Trainer(dmc, model_constant, tmp, data, [], "serial, no decay"), tmp)
        # interleaved 1F1B (two model chunks per pipeline rank), clipped, with ZeRO 2
        interleaved = Trainer(dmc, model_constant, tmp, data, ["--mesh", "data=2,pipeline=2", "--microbatches", "2",
                                                               "--schedule", "interleaved", "--chunks", "2", "--zero", "2"])
        straight_vs_resumed(interleaved, tmp)
        if sources[1]:
            cross_mesh([interleaved], sources[1], tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
