#!/usr/bin/env python3
"""test_checkpoint_compat.py DMC: --resume refuses a checkpoint of another program (docs/trainer.md,
"Checkpoints"), before the first step, naming the file, what differs and how to resume instead.

The model is test_checkpoint.py's small MLP (AdamW, warmup + cosine), compiled serially in
variants; each refusal was accepted before (the run trained on, the state dropped or wrong):

  - fp16's checkpoint (its loss scaler's state, with the updates it skipped) into a program
    without a loss scaler: refused, saying --precision fp16 (that program's AdamW would count
    the skipped updates as done); a checkpoint without a scaler into an fp16 program resumes
    (the scaler starts fresh, nothing skipped: consistent);
  - fp16's --loss-scale-interval: recorded (dmc.loss_scale_interval), another refused naming
    both intervals; a file of before (no interval) whose clean steps reach this program's
    interval is refused as of a larger interval, not as a corrupt file; fp16 resumes into
    itself, bitwise as straight;
  - another model's checkpoint (same tensors, another name: dmc --name): refused, naming both
    models and --name;
  - tensors the program does not read: AdamW's state into an sgd program, --prune's masks
    into a program without --prune: refused, naming one;
  - another batch size (--set B=16): the step's inputs are recorded (trainer.inputs) and
    another's refused; a checkpoint without trainer.inputs (before) resumes as before;
  - --help of --resume does not claim that 5 + --resume + 5 is 10 steps whatever the
    schedule, and the note of a changed --steps holds for a constant learning rate too.
Prints one line per check; exits 1 on any failure.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_checkpoint as tc  # noqa: E402  (its model, data and safetensors helpers)

check = tc.check


def refused(t, args, pattern, what):
    r = t.run(["--steps", "8"] + args)
    tc.refused_run(r, pattern, what)


def checkpoint_of(t, tmp, tag, steps=5):
    """The checkpoint of t's run of `steps` steps (of a run of 10)."""
    d = os.path.join(tmp, "ckpt-" + tag)
    r = t.run(["--steps", "10", "--checkpoint", d, "--checkpoint-every", str(steps)])
    path = os.path.join(d, "step-%08d.safetensors" % steps)
    check(r.returncode == 0 and os.path.exists(path), "%s: writes a checkpoint (%s)" % (t.name, r.stderr.strip()[-200:]))
    return path


def variant(tmp, model, name, replace):
    with open(model) as f:
        src = f.read()
    for a, b in replace:
        assert a in src, a
        src = src.replace(a, b)
    path = os.path.join(tmp, name, "small.dm")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(src)
    return path


def loss_scaler(base, fp16, fp16_other, tmp):
    """Items 1 and 6: the loss scaler's state and interval."""
    ck16 = checkpoint_of(fp16, tmp, "fp16")
    tensors, meta = tc.read_safetensors(ck16)
    check(meta.get("dmc.loss_scale_interval") == "2000", "fp16's checkpoint records its interval (%s)"
          % meta.get("dmc.loss_scale_interval"))
    refused(base, ["--resume", ck16], re.escape(ck16) + r": a checkpoint of an fp16 program .*--precision fp16",
            "an fp16 checkpoint into a program without a loss scaler")
    refused(fp16_other, ["--resume", ck16], re.escape(ck16) + r": .*after 2000 clean steps, this program's after 3: "
            r".*--loss-scale-interval 2000", "an fp16 checkpoint into a program of another --loss-scale-interval")
    # a file of before the interval was recorded, with 5 clean steps, into an interval of 3
    old = os.path.join(tmp, "fp16-old.safetensors")
    tc.write_safetensors(old, tensors, {k: v for k, v in meta.items() if k != "dmc.loss_scale_interval"})
    refused(fp16_other, ["--resume", old], re.escape(old) + r": .*5 clean steps.*after 3: .*larger --loss-scale-interval",
            "an fp16 checkpoint of before (no interval) past this program's interval: a larger interval, not corruption")
    # with its interval recorded, clean steps at it are no scaler's state (it would have doubled)
    bad = os.path.join(tmp, "fp16-bad.safetensors")
    tc.write_safetensors(bad, tensors, dict(meta, **{"dmc.loss_scale_good_steps": "2000"}))
    refused(fp16, ["--resume", bad], re.escape(bad) + r": metadata \"dmc.loss_scale\" is .*not a loss scaler's state",
            "an fp16 checkpoint whose clean steps reach its own recorded interval")
    straight, resumed = os.path.join(tmp, "fp16-straight.st"), os.path.join(tmp, "fp16-resumed.st")
    a = fp16.run(["--steps", "10", "--save", straight])
    b = fp16.run(["--steps", "10", "--resume", ck16, "--save", resumed])
    check(a.returncode == 0 and b.returncode == 0 and open(straight, "rb").read() == open(resumed, "rb").read(),
          "fp16: 5 + --resume + 5 gives the weights of 10 straight (%s)" % (a.stderr + b.stderr).strip()[-200:])
    ck32 = checkpoint_of(base, tmp, "fp32")
    r = fp16.run(["--steps", "7", "--resume", ck32])
    check(r.returncode == 0 and "step 7 loss" in r.stdout,
          "a checkpoint without a loss scaler resumes in an fp16 program (%s)" % r.stderr.strip()[-200:])
    return ck32


def other_program(base, renamed, sgd, pruned, wide, ck32, tmp):
    """Items 2, 3, 4: another model, optimizer, pruning or batch size."""
    refused(renamed, ["--resume", ck32], re.escape(ck32) + r": a checkpoint of model 'small', this program is model "
            r"'other': .*--name small", "another model's checkpoint (tensors of the same names and shapes)")
    refused(sgd, ["--resume", ck32], re.escape(ck32) + r": tensor '[\w.]+\.exp_avg(_sq)?' is not one this program reads",
            "AdamW's checkpoint into an sgd program (its state would be dropped)")
    ckp = checkpoint_of(pruned, tmp, "pruned")
    refused(base, ["--resume", ckp], re.escape(ckp) + r": tensor '[\w.]+\.prune_mask' is not one this program reads",
            "a --prune checkpoint into a program without --prune (its masks would be dropped)")
    tensors, meta = tc.read_safetensors(ck32)
    check(meta.get("trainer.inputs") == "x: f32[32, 784], y: i32[32]",
          "the checkpoint records the step's inputs (%s)" % meta.get("trainer.inputs"))
    refused(wide, ["--resume", ck32], r"checkpoint " + re.escape(ck32) + r" was trained on steps of inputs x: f32\[32, "
            r"784\], y: i32\[32\], this program's are x: f32\[16, 784\], y: i32\[16\]",
            "a checkpoint of B=32 into a program of B=16 (the data's position is another)")
    old = os.path.join(tmp, "no-inputs.safetensors")
    tc.write_safetensors(old, tensors, {k: v for k, v in meta.items() if k != "trainer.inputs"})
    r = base.run(["--steps", "7", "--resume", old])
    check(r.returncode == 0 and "step 7 loss" in r.stdout,
          "a checkpoint without trainer.inputs (before) still resumes (%s)" % r.stderr.strip()[-200:])


def help_and_note(base, constant, tmp):
    """Item 5: --help, and the note of a changed --steps."""
    h = subprocess.run([base.exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    text = " ".join(h.stdout.split())
    check("5 + --resume + 5 give the same weights" not in text and "decaying learning rate" in text,
          "--help of --resume says when a resumed run gives the straight run's weights")
    ck = checkpoint_of(constant, tmp, "constant")
    r = constant.run(["--steps", "12", "--resume", ck])
    note = [l for l in r.stderr.splitlines() if "was to train 10 steps, this one 12" in l]
    check(r.returncode == 0 and len(note) == 1 and "constant learning rate is unchanged" in note[0],
          "a constant learning rate's changed --steps: the note is true of it (%s)" % note)


def main():
    dmc = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-ckpt-compat-")
    try:
        model = tc.small_mlp(tmp)
        data = tc.fashion_like(tmp)
        base = tc.Trainer(dmc, model, tmp, data, [], "serial")
        fp16 = tc.Trainer(dmc, model, tmp, data, ["--precision", "fp16"])
        fp16_other = tc.Trainer(dmc, model, tmp, data, ["--precision", "fp16", "--loss-scale-interval", "3"])
        ck32 = loss_scaler(base, fp16, fp16_other, tmp)
        sgd = tc.Trainer(dmc, variant(tmp, model, "sgd", [("optimizer adamw(", "optimizer sgd("),
                                                           (", weight_decay = 1e-4", "")]),
                         tmp, data, [], "sgd")
        renamed = tc.Trainer(dmc, model, tmp, data, ["--name", "other"])
        renamed.exe = os.path.join(renamed.dir, "other")
        pruned = tc.Trainer(dmc, model, tmp, data, ["--prune", "0.5"])
        wide = tc.Trainer(dmc, model, tmp, data, ["--set", "B=16"])
        other_program(base, renamed, sgd, pruned, wide, ck32, tmp)
        constant = tc.Trainer(dmc, variant(tmp, model, "constant", [(", warmup = 3, decay = cosine, min_lr = 1e-3", "")]),
                              tmp, data, [], "constant")
        help_and_note(base, constant, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % tc.failures)
    sys.exit(1 if tc.failures else 0)


if __name__ == "__main__":
    main()
