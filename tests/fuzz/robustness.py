#!/usr/bin/env python3
"""robustness.py: dmc --check on hostile inputs.

    robustness.py DMC [--known-bugs] [--keep DIR] [--time-scale X] [NAME ...]

Each case is a generated file. dmc must finish within 10 s (times X for a slower build:
meson passes 5 for sanitizer builds, whose dmc runs some cases 25x slower) with exit status 0 or 1
(never a signal, never another status); a case marked broken must exit with 1 and
print at least one `error:` line, a valid one must exit with 0. dmc runs under a 2 GiB
address-space limit (dropped when dmc cannot even start under it, as with ASan), so a
memory blow-up shows as a failure instead of taking the machine down.

Cases marked known_bug show compiler bugs that are not fixed yet; they run only with
--known-bugs (the meson test fuzz-known-bugs), which fails until they are fixed.
--keep DIR keeps the generated files there.
"""
import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 10
MEMORY_LIMIT = 2 << 30

BROKEN, VALID, EITHER = "broken", "valid", "either"


def random_bytes(seed, n):
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(n))


def random_tokens(seed, n):
    """Plausible tokens in random order: gets much further into the parser."""
    rng = random.Random(seed)
    toks = ["dim", "mesh", "input", "param", "layer", "repeat", "block", "return", "output",
            "minimize", "optimizer", "x", "B", "f32", "i32", "relu", "sum", "reshape", "(", ")",
            "[", "]", "{", "}", "=", ":", ",", "@", "+", "-", "*", "/", "\n", "1", "2.5", "-1",
            "sgd", "lr", "#c\n"]
    return " ".join(rng.choice(toks) for _ in range(n)).encode()


def nested_blocks(depth):
    return ("block f(x) {\n" * depth + "return x\n" + "}\n" * depth).encode()


MLP = b"""dim B = 4
dim D = 8
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT] = xavier
    param bias : f32[OUT] = zeros
    return x @ weight + bias
}
input x : f32[B, D]
input y : i32[B]
layer fc = linear[D, D]
loss = cross_entropy(fc(x), y)
minimize loss
optimizer sgd(lr = 0.1)
"""

# name -> (contents, expectation, known_bug[, extra check]); the extra check runs
# `dmc --emit=ir` on a valid file (see extra_check).
CASES = {
    # no model at all: an error (the program is empty), not an empty model
    "empty": (b"", BROKEN, False),
    "only-comments": (b"".join(b"# comment %d: { ( [ @ $ \xc3\xa9\n" % i for i in range(1000)), BROKEN, False),
    "only-newlines": (b"\n" * 100000, BROKEN, False),
    "valid-mlp": (MLP, VALID, False),
    "random-bytes-1": (random_bytes(1, 65536), BROKEN, False),
    "random-bytes-2": (random_bytes(2, 4096), BROKEN, False),
    "random-bytes-3": (random_bytes(3, 1 << 20), BROKEN, False),
    "random-tokens-1": (random_tokens(1, 20000), BROKEN, False),
    "random-tokens-2": (random_tokens(2, 200000), BROKEN, False),
    "long-line-name": (b"y = " + b"a" * (1 << 20) + b"\n", BROKEN, False),
    "long-line-comment": (b"# " + b"c" * (1 << 20) + b"\n" + MLP, VALID, False),
    "long-line-errors": (b"y = relu(q) + " * 80000 + b"\n", BROKEN, False),
    "long-line-no-newline": (b"dim B = 4\ninput x : f32[B]\ny = " + b"x * " * 250000 + b"x", BROKEN, False),
    "nested-parens-100000": (b"y = " + b"(" * 100000 + b"1" + b")" * 100000 + b"\n", BROKEN, False),
    "nested-brackets-100000": (b"input x : f32" + b"[" * 100000 + b"\n", BROKEN, False),
    "open-parens-only": (b"(" * 100000, BROKEN, False),
    "close-parens-only": (b")" * 100000, BROKEN, False),
    "nested-braces-10000": (b"{" * 10000 + b"}" * 10000 + b"\n", BROKEN, False),
    "nested-blocks-10000": (nested_blocks(10000), BROKEN, False),
    "stray-braces-100000": (b"}\n" * 100000, BROKEN, False),
    "unary-minus-10000": (b"input x : f32[2]\ny = " + b"-" * 10000 + b"x\n", BROKEN, False),
    "unary-minus-dim-10000": (b"dim B = " + b"-" * 10000 + b"1\n", BROKEN, False),
    "sum-200000-terms": (b"input a : f32[2]\ny = " + b"+".join([b"a"] * 200000) + b"\n", BROKEN, False),
    "dim-sum-200000-terms": (b"dim B = " + b"+".join([b"1"] * 200000) + b"\n", BROKEN, False),
    "huge-integer": (b"dim B = " + b"9" * 100000 + b"\n", BROKEN, False),
    "huge-float": (b"optimizer sgd(lr = " + b"9" * 400 + b".5)\n", BROKEN, False),
    "huge-exponent": (b"optimizer sgd(lr = 1e99999999999999999999)\n", BROKEN, False),
    "tiny-float": (MLP.replace(b"lr = 0.1", b"lr = 1e-99999"), VALID, False),
    "int64-max": (b"dim B = 9223372036854775807\n", BROKEN, False),
    "dims-product-overflow": (b"dim A = 4000000000\ndim B = A * A * A\n", BROKEN, False),
    "dims-sum-overflow": (b"dim A = 4611686018427387903\ndim B = A + A + A\n", BROKEN, False),
    "dims-negative-overflow": (b"dim A = 4611686018427387903\ndim B = 0 - A - A - A\n", BROKEN, False),
    "shape-overflow": (b"dim A = 4000000000\ninput x : f32[A, A, A, A]\n", BROKEN, False),
    "shape-too-large": (b"param w : f32[1048576, 1048576, 1048576] = zeros\n", BROKEN, False),
    "reshape-overflow": (b"input x : f32[4]\ny = reshape(x, [4611686018427387903, 4611686018427387903, -1])\n",
                         BROKEN, False),
    "division-by-zero-dim": (b"dim B = 4 / 0\n", BROKEN, False),
    "division-by-zero-const": (b"optimizer sgd(lr = 1 / 0)\n", BROKEN, False),
    "repeat-1000000": (b"block f(x) {\nreturn relu(x)\n}\nlayer h = repeat 1000000 f\n", BROKEN, False),
    "repeat-int64-max": (b"block f(x) {\nreturn x\n}\nlayer h = repeat 4611686018427387903 f\n", BROKEN, False),
    "repeat-4096-called": (b"block f(x) {\nparam w : f32[2] = ones\nreturn relu(x * w)\n}\n"
                           b"layer h = repeat 4096 f\ninput x : f32[2]\nl = sum(h(x))\nminimize l\n"
                           b"optimizer adamw(lr = 0.1)\n", VALID, False),
    "recursive-block": (b"block f(x) {\nlayer g = f\nreturn g(x)\n}\nlayer h = f\n", BROKEN, False),
    "mutually-recursive-blocks": (b"block f(x) {\nlayer a = g\nreturn a(x)\n}\n"
                                  b"block g(x) {\nlayer b = f\nreturn b(x)\n}\nlayer h = f\n", BROKEN, False),
    "nul-bytes": (b"dim B = 4\x00\ninput x : f32[B]\n", BROKEN, False),
    "nul-in-name": (b"dim B\x00C = 4\n", BROKEN, False),
    "nul-in-comment": (b"# a \x00 comment\ndim B = 4\n", EITHER, False),
    "only-nul-bytes": (b"\x00" * 100000, BROKEN, False),
    "many-errors": (b"y = relu(q)\n" * 100000, BROKEN, False),
    "many-mesh-axes": (b"mesh(" + b", ".join(b"a%d = 1" % i for i in range(100)) + b")\n", BROKEN, False),
    "many-block-params": (b"block f[" + b", ".join(b"D%d" % i for i in range(10000)) + b"](x) {\nreturn x\n}\n"
                          b"layer l = f[" + b", ".join([b"1"] * 10000) + b"]\n" + MLP, VALID, False),
    "many-layer-args": (b"block f(" + b", ".join(b"x%d" % i for i in range(100)) + b") {\nreturn x0\n}\n"
                        b"layer l = f\ninput x : f32[2]\ny = l(" + b", ".join([b"x"] * 100) + b")\n", BROKEN, False),
    "long-dotted-name": (b"y = " + b".".join([b"a"] * 100000) + b"\n", BROKEN, False),
    "crlf-line-ends": (MLP.replace(b"\n", b"\r\n"), VALID, False),
    "no-final-newline": (MLP.rstrip(b"\n"), VALID, False),
    # Regressions: each was a bug (hang, blow-up, crash or silent acceptance).
    # Name lookup was a linear scan per scope, so N statements cost O(N^2).
    "many-dims-100000": (b"".join(b"dim D%d = %d\n" % (i, i + 1) for i in range(100000)) + MLP, VALID, False),
    "many-lets-100000": (b"input y0 : f32[2]\nparam w : f32[2] = ones\ny1 = y0 * w\n"
                         + b"".join(b"y%d = y%d + 1\n" % (i, i - 1) for i in range(2, 100000))
                         + b"l = sum(y99999)\nminimize l\noptimizer sgd(lr = 0.1)\n", VALID, False),
    # Each repeat is capped at 4096 but their product was not: 16M instances, tens of GiB.
    "nested-repeat-4096x4096": (b"block leaf(x) {\nparam w : f32[1] = ones\nreturn x * w\n}\n"
                                b"block mid(x) {\nlayer g = repeat 4096 leaf\nreturn g(x)\n}\n"
                                b"layer h = repeat 4096 mid\n", BROKEN, False),
    # A block instantiating itself twice: 2^32 instantiations before the nesting limit.
    "recursive-block-twice": (b"block f(x) {\nlayer a = f\nlayer b = f\nreturn x\n}\nlayer l = f\n", BROKEN, False),
    # pass_memory sorted the live list for every value: 78k values took ~30 s.
    "memory-plan-78k-values": (b"block f(x) {\nparam w : f32[2] = ones\n"
                               b"return relu(tanh(x * w) + sigmoid(x) * x)\n}\n"
                               b"layer h = repeat 4096 f\ninput x : f32[2]\nl = sum(h(x))\nminimize l\n"
                               b"optimizer adamw(lr = 0.1)\n", VALID, False),
    # The element count of reshape's new shape wrapped around 2^64: (2^61 + 3) * 8 = 2^64 + 24.
    "reshape-wraps-around": (b"input x : f32[4, 6]\ny = reshape(x, [2305843009213693955, 8])\noutput y\n",
                             BROKEN, False),
    # Value names were built in 512-byte buffers and silently cut: two layers with long
    # names got parameters of the same name.
    "long-layer-names": (b"block f(x) {\nparam w : f32[3] = ones\nreturn x * w\n}\n"
                         b"layer " + b"a" * 600 + b"1 = f\nlayer " + b"a" * 600 + b"2 = f\n"
                         b"input x : f32[3]\nl = sum(" + b"a" * 600 + b"1(x) + " + b"a" * 600 + b"2(x))\n"
                         b"minimize l\noptimizer sgd(lr = 0.1)\n",
                         VALID, False, "distinct-param-names"),
    # A layer whose declaration failed stayed bound with no instance: calling it
    # dereferenced NULL (lower_call_layer in ir/lower.c).
    "call-failed-layer": (b"block f(x) {\nreturn x\n}\nlayer l = f[3]\ninput x : f32[3]\ny = l(x)\n", BROKEN, False),
    # Known bugs (known_bug True) fail until fixed: meson test fuzz-known-bugs. None now.
}


def extra_check(dmc, path, what, preexec):
    """A problem found by the named check, or None."""
    if what == "distinct-param-names":
        p = subprocess.run([dmc, "--emit=ir", "--stop-after=lower", path], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT_S,
                           preexec_fn=preexec)
        names = [line.split()[1] for line in p.stdout.decode("utf-8", "replace").splitlines()
                 if " : param " in line]
        if len(set(names)) != len(names):
            return "parameters with the same name in the IR: %d params, %d distinct names" % (
                len(names), len(set(names)))
        return None
    raise ValueError(what)


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(dmc, path, preexec):
    start = time.monotonic()
    try:
        p = subprocess.run([dmc, "--check", path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=TIMEOUT_S, preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        return None, b"", time.monotonic() - start
    return p.returncode, p.stderr, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dmc")
    ap.add_argument("--known-bugs", action="store_true", help="run only the cases of known bugs")
    ap.add_argument("--keep", metavar="DIR", help="write the generated files to DIR and keep them")
    ap.add_argument("--time-scale", type=float, default=1.0, help="allow X times the 10 s a case may take")
    ap.add_argument("names", nargs="*")
    opts = ap.parse_intermixed_args()
    global TIMEOUT_S
    TIMEOUT_S *= opts.time_scale
    dmc = os.path.abspath(opts.dmc)
    names = opts.names or [n for n, c in CASES.items() if c[2] == opts.known_bugs]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print("robustness: no such case: %s" % ", ".join(unknown))
        return 2

    work = opts.keep or tempfile.mkdtemp(prefix="dmc-robustness-")
    os.makedirs(work, exist_ok=True)
    try:
        valid = os.path.join(work, "calibrate.dm")
        with open(valid, "wb") as f:
            f.write(MLP)
        preexec = limit_memory
        if run(dmc, valid, preexec)[0] != 0:
            print("note: dmc does not start under a %d MiB address-space limit; running without it"
                  % (MEMORY_LIMIT >> 20))
            preexec = None
        failed = []
        for name in names:
            data, expect, known_bug = CASES[name][:3]
            check = CASES[name][3] if len(CASES[name]) > 3 else None
            path = os.path.join(work, name + ".dm")
            with open(path, "wb") as f:
                f.write(data)
            rc, err, secs = run(dmc, path, preexec)
            problems = []
            if rc is None:
                problems.append("did not finish within %g s" % TIMEOUT_S)
            elif rc < 0:
                problems.append("killed by signal %d" % -rc)
            elif rc not in (0, 1):
                problems.append("exit status %d (expected 0 or 1)" % rc)
            elif expect == BROKEN and rc != 1:
                problems.append("accepted (exit status 0), expected errors")
            elif expect == VALID and rc != 0:
                problems.append("rejected (exit status %d), expected no error" % rc)
            if rc == 1 and b"error:" not in err:
                problems.append("exit status 1 without an `error:` line")
            if check and rc == 0 and not problems:
                found = extra_check(dmc, path, check, preexec)
                if found:
                    problems.append(found)
            tag = " (known bug)" if known_bug else ""
            if problems:
                failed.append(name)
                print("FAIL %s%s: %s [%d bytes, %.1f s]" % (name, tag, "; ".join(problems), len(data), secs))
                text = err.decode("utf-8", "replace")
                if text:
                    print("  stderr (first 5 lines):\n    " + "\n    ".join(text.splitlines()[:5]))
            else:
                print("ok   %s%s: exit %d in %.2f s" % (name, tag, rc, secs))
        print("robustness: %d cases, %d failed" % (len(names), len(failed)))
        return 1 if failed else 0
    finally:
        if not opts.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
