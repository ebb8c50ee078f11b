#!/usr/bin/env python3
"""test_evaluate.py DMC: the trainer's --evaluate (docs/trainer.md, "Evaluating saved weights").

Oracle: the serial program itself. A short training run prints its final test accuracy
(Fashion-MNIST-shaped data, test_checkpoint.py's small mlp) or validation loss (a small
gpt.dm on a text corpus) and saves its weights; --evaluate --init of those weights prints
the same line, trains nothing (no step line; evaluated twice, the same; the weights file
untouched), and refuses the options of training with a message naming them.
Prints one line per check; exits 1 on any failure.
"""
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_checkpoint  # noqa: E402
from test_checkpoint import check, Trainer, fashion_like, small_mlp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def final_line(out, pattern):
    lines = [l for l in out.splitlines() if re.match(pattern, l)]
    return lines[-1] if lines else None


def evaluate_matches(run, train_args, pattern, what, tmp):
    weights = os.path.join(tmp, what + ".safetensors")
    a = run(train_args + ["--save", weights])
    check(a.returncode == 0 and final_line(a.stdout, pattern), "%s: a short run trains and saves (%s)"
          % (what, a.stderr.strip()[-200:]))
    if a.returncode != 0:
        return None
    before = open(weights, "rb").read()
    b = run(["--evaluate", "--init", weights])
    c = run(["--evaluate", "--init", weights])
    want = final_line(a.stdout, pattern)
    check(b.returncode == 0 and final_line(b.stdout, pattern) == want,
          "%s: --evaluate prints the run's final '%s' (got %s)" % (what, want, final_line(b.stdout, pattern)))
    check(not re.search(r"^(step|trained|epoch) ", b.stdout, re.M) and c.stdout == b.stdout
          and open(weights, "rb").read() == before,
          "%s: --evaluate takes no step (no step line, the same twice, the file untouched)" % what)
    return weights


def refusals(t, weights):
    cases = [(["--steps", "3"], "--steps"), (["--epochs", "1"], "--epochs"), (["--save", "x.st"], "--save"),
             (["--checkpoint", "ck"], "--checkpoint"), (["--dump-grads", "g.st"], "--dump-grads"),
             (["--predict"], "--predict")]
    for extra, name in cases:
        r = t.run(["--evaluate", "--init", weights] + extra)
        check(r.returncode == 2 and "--evaluate trains nothing: it cannot be combined with %s" % name in r.stderr,
              "--evaluate %s: refused (%s)" % (" ".join(extra), r.stderr.strip().splitlines()[0] if r.stderr else ""))
    r = t.run(["--evaluate"])
    check(r.returncode == 2 and "--evaluate needs --init FILE" in r.stderr, "--evaluate without --init: refused")


def text_model(dmc, tmp):
    rng = random.Random(5)
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("".join(rng.choice("abcdefgh \n") for _ in range(4000)))
    build = os.path.join(tmp, "build-gpt")
    r = subprocess.run([dmc, "run", os.path.join(ROOT, "examples", "gpt.dm"), "--set", "V=256,T=8,C=16,NH=2,L=1,B=2",
                        "--keep", build, "--", "--steps", "0", "--quiet", "--data", "text:" + corpus],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    check(r.returncode == 0, "a small gpt.dm compiles (%s)" % r.stderr.strip()[-200:])

    def run(args):
        return subprocess.run([os.path.join(build, "gpt"), "--quiet", "--data", "text:" + corpus] + args, cwd=tmp,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    return run if r.returncode == 0 else None


def main():
    dmc = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="dmc-evaluate-")
    try:
        data = fashion_like(tmp)
        model = small_mlp(tmp)
        t = Trainer(dmc, model, tmp, data, [])
        weights = evaluate_matches(t.run, ["--steps", "3"], r"test accuracy ", "fashion-mnist", tmp)
        if weights:
            refusals(t, weights)
        gpt = text_model(dmc, tmp)
        if gpt:
            evaluate_matches(gpt, ["--steps", "3"], r"val loss ", "text", tmp)
        # dmc run passes --evaluate on: checked against the trainer's table before compiling
        r = subprocess.run([dmc, "run", model, "--evaluate", "--init", weights or "none", "--data-dir", data, "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
        check(r.returncode == 0 and re.match(r"test accuracy ", r.stdout) is not None,
              "dmc run MODEL --evaluate --init W prints the test accuracy (%s)" % r.stderr.strip()[-200:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % test_checkpoint.failures)
    sys.exit(1 if test_checkpoint.failures else 0)


if __name__ == "__main__":
    main()
