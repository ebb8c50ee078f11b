#!/usr/bin/env python3
"""driver_fuzz.py DMC SECONDS [--seed S] [--keep DIR]: mutation fuzzing of the whole dmc
driver, past where the libFuzzer target (fuzz_frontend.c) stops: code generation (-o),
meshes, ZeRO, precisions, recomputation, schedules, the CUDA target, compression, pruning
and parameter servers.

Each case is a program of the repository (examples/, tests/) mutated a few times (a line
deleted, repeated, swapped or taken from another program; a token replaced by another of
the corpus, a boundary number or nothing), run as one of `--check`, `--emit=ir`,
`--explain=json`, `--explain=full` or `-o DIR`, with one or two option sets. The oracle is
dmc's contract: it exits 0, 1 or 2 within 20 s, with no sanitizer report and no "internal
error". Each distinct failure (by its first sanitizer, runtime-error or internal-error line)
is kept under --keep DIR (default: a fresh temporary directory) with its program, command
and output. Deterministic for a seed; the cases run until SECONDS are up. Exit status 1
when anything was found, 0 otherwise. Run by .ci/run for a minute on the sanitized build.
"""
import argparse
import glob
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*|\d+\.?\d*(?:e[-+]?\d+)?|\S")
BOUNDARY = ["0", "1", "-1", "2", "3", "4096", "4097", "65536", "2147483648", "4611686018427387903", "1e308", "0.5",
            "1e-45", "-0", "(", ")", "[", "]", "{", "}", ",", "=", "@", "@data", "@tensor", "@pipeline", "\n", ";", "-",
            "*", "/", "transpose(", "reshape(", "sum(", "x", "B", "T", "C"]
OPTIONS = [[], [], ["--mesh", "data=2"], ["--mesh", "tensor=2"], ["--mesh", "pipeline=2"], ["--microbatches", "2"],
           ["--zero", "1"], ["--zero", "3"], ["--precision", "bf16"], ["--precision", "fp16"], ["--recompute", "full"],
           ["--recompute", "selective"], ["--schedule", "1f1b"], ["--sequence-parallel"], ["--target", "cuda"],
           ["--no-fuse-attention"], ["--no-hoist-constants"], ["--compress", "bf16"], ["--prune", "0.5"],
           ["--set", "B=2"], ["--schedule", "interleaved", "--chunks", "2"], ["--param-servers", "1"],
           ["--schedule", "2bw", "--mesh", "pipeline=2", "--microbatches", "2"], ["--quantize", "int8"]]
MODES = [["--check"], ["--emit=ir"], ["--explain=json"], ["--explain=full"], ["-o", "OUTDIR"]]
SIGNATURE = re.compile(r"SUMMARY: \S+ \S+ \S+|runtime error: [^\n]{0,60}|internal error[^\n]{0,60}")


def corpus_of(root):
    texts = []
    for path in sorted(glob.glob(os.path.join(root, "examples", "*.dm")) +
                       glob.glob(os.path.join(root, "tests", "**", "*.dm"), recursive=True)):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < 20000:
            texts.append(text)
    tokens = set()
    for text in texts:
        for line in text.splitlines():
            tokens.update(TOKEN.findall(line.split("#")[0]))
    return texts, sorted(tokens)


def mutate(rng, text, texts, tokens):
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.15 and len(lines) > 1:
            del lines[rng.randrange(len(lines))]
        elif r < 0.25:
            lines.insert(rng.randrange(len(lines)), lines[rng.randrange(len(lines))])
        elif r < 0.35:
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(rng.choice(texts).split("\n")))
        elif r < 0.45 and len(lines) > 1:
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        else:
            i = rng.randrange(len(lines))
            spans = [(m.start(), m.end()) for m in TOKEN.finditer(lines[i])]
            if not spans:
                continue
            a, b = rng.choice(spans)
            k = rng.random()
            if k < 0.3:
                new = rng.choice(tokens)
            elif k < 0.55:
                new = rng.choice(BOUNDARY)
            elif k < 0.7:
                new = ""
            elif k < 0.85:
                new = lines[i][a:b] + " " + rng.choice(tokens + BOUNDARY)
            else:
                numbers = list(re.finditer(r"\b\d+\b", lines[i]))
                if numbers:
                    m = rng.choice(numbers)
                    a, b = m.start(), m.end()
                    new = str(rng.choice([0, 1, 2, 3, 5, 7, 64, 4096, 2**31, 2**40, 2**62 - 1, int(m.group()) * 2,
                                          int(m.group()) + 1]))
                else:
                    new = rng.choice(BOUNDARY)
            lines[i] = lines[i][:a] + new + lines[i][b:]
    return "\n".join(lines)


def failure_of(rc, out):
    """What is wrong with a run, or None."""
    if rc is None:
        return "timeout"
    if rc < 0 or rc > 2:
        return "exit%d" % rc
    if "Sanitizer" in out or "runtime error:" in out:
        return "sanitizer"
    if "internal error" in out.lower():
        return "internal"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dmc")
    ap.add_argument("seconds", type=float)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    texts, tokens = corpus_of(root)
    rng = random.Random(a.seed)
    keep = a.keep or tempfile.mkdtemp(prefix="dmc-driver-fuzz-")
    os.makedirs(keep, exist_ok=True)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    runs, found, end = 0, {}, time.time() + a.seconds
    with tempfile.TemporaryDirectory(prefix="dmc-driver-fuzz-run-") as tmp:
        program, out_dir = os.path.join(tmp, "case.dm"), os.path.join(tmp, "out")
        while time.time() < end:
            runs += 1
            text = mutate(rng, rng.choice(texts), texts, tokens)
            options = rng.choice(OPTIONS) + (rng.choice(OPTIONS) if rng.random() < 0.3 else [])
            cmd = [a.dmc] + [x.replace("OUTDIR", out_dir) for x in rng.choice(MODES)] + options + [program]
            with open(program, "w", encoding="utf-8") as f:
                f.write(text)
            try:
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20, env=env)
                rc, out = r.returncode, r.stdout.decode(errors="replace")
            except subprocess.TimeoutExpired:
                rc, out = None, "timeout"
            what = failure_of(rc, out)
            if not what:
                continue
            sig = SIGNATURE.findall(out)
            key = what + "_" + hashlib.md5((what + (sig[0] if sig else out[-200:])).encode()).hexdigest()[:8]
            if key in found:
                continue
            found[key] = " ".join(cmd)
            case = os.path.join(keep, key)
            os.makedirs(case, exist_ok=True)
            shutil.copy(program, os.path.join(case, "case.dm"))
            with open(os.path.join(case, "cmd"), "w") as f:
                f.write(" ".join(cmd) + "\nexit %s\n" % rc)
            with open(os.path.join(case, "out"), "w") as f:
                f.write(out[-20000:])
            print("FOUND %s: %s (kept in %s)" % (key, (sig[0] if sig else out.strip()[-120:]), case))
    print("driver_fuzz: %d programs in %.0f s (seed %d), %d failures%s" %
          (runs, a.seconds, a.seed, len(found), " kept in " + keep if found else ""))
    if not found and not a.keep:
        shutil.rmtree(keep, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
