"""Values made once at create (passes/hoist_constants.c): examples/llama.dm's RoPE tables,
computed from arange in the program, depend on no input, parameter or random draw.

1. The generated C computes them only in create's functions: every sinf and cosf of the
   program (the tables' cos(emb) and sin(emb); nothing else takes a sine) is in
   make_constants (stage%d_constants with stages), none in a step's function; with
   --no-hoist-constants (the code dmc generated before) they are in the forward pass and
   there is no such function.
2. Training gives bitwise the same step losses and saved weights as that per-step program
   (the oracle), serially and on a mesh of each kind: tensor parallelism, sequence
   parallelism, accumulated micro-batches (a copy of the arena per
   micro-batch in flight) with every layer recomputed (which makes no table again), and
   pipeline stages under 1F1B, 2 micro-batches in flight on the first, and under 2bw (each
   micro-batch's copy of the arena chosen by its number in the stream; llama.dm without its
   gradient clipping, which 2bw does not build).

usage: test_constants.py DMC SOURCE_ROOT"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
from dmcrun import Failure, require_target, step_fields, target_args  # noqa: E402

SIZES = "V=256,T=16,C=32,NH=4,NKV=2,F=48,L=2,B=4"
MESHES = [[],
          ["--mesh", "tensor=2", "--sequence-parallel"],
          ["--accumulate", "2", "--recompute", "full"],
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "1f1b"],
          # (on llama.dm without its gradient clipping, which 2bw does not build)
          ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw"]]


def functions(source):
    """{name: body} of the generated C's functions (each from its head to the next)."""
    heads = list(re.finditer(r"^(?:static )?int (\w+)\(", source, re.M))
    return {m.group(1): source[m.start():(heads[k + 1].start() if k + 1 < len(heads) else len(source))]
            for k, m in enumerate(heads)}


def trig_calls(body):
    return len(re.findall(r"\b(?:sinf|cosf)\(", body))


def check_generated(dmc, llama, tmp, mesh, makers):
    """Where the sines and cosines are, hoisted and not; makers: create's function names."""
    where = {}
    for hoisted in (True, False):
        out = os.path.join(tmp, "code-%s-%d" % ("-".join(mesh) or "serial", hoisted))
        cmd = [dmc, llama, "--set", SIZES, "-o", out] + mesh + ([] if hoisted else ["--no-hoist-constants"])
        # the loops in place (not in helpers written once, codegen/outline_loops.c): which
        # function computes the sines is what is checked
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=120,
                           env=dict(os.environ, DMC_OUTLINE_LOOPS="off"))
        if r.returncode != 0:
            raise Failure("`%s` exited %d:\n%s" % (" ".join(cmd), r.returncode, r.stdout))
        with open(os.path.join(out, "llama.c")) as f:
            fns = functions(f.read())
        where[hoisted] = {name: trig_calls(body) for name, body in fns.items() if trig_calls(body)}
    label = " ".join(mesh) or "serial"
    print("%-40s sin/cos by function: hoisted %s; per step %s" % (label, where[True], where[False]))
    if not where[True] or set(where[True]) - set(makers):
        raise Failure("%s: sines and cosines outside create's functions %s: %s" % (label, makers, where[True]))
    if any(name in makers for name in where[False]) or not where[False]:
        raise Failure("%s: --no-hoist-constants still makes the tables at create: %s" % (label, where[False]))
    # (per step, recomputation makes the tables again in the backward pass)
    forward = sum(count for name, count in where[False].items() if name.endswith("forward"))
    if sum(where[True].values()) != forward:
        raise Failure("%s: %d sines and cosines hoisted, %d in the per-step forward pass" %
                      (label, sum(where[True].values()), forward))


def train(dmc, llama, tmp, corpus, mesh, hoisted):
    """The step losses (as printed: 9 digits, exact for f32) and the saved weights' bytes."""
    weights = os.path.join(tmp, "w-%s-%d.safetensors" % ("-".join(mesh) or "serial", hoisted))
    cmd = [dmc, "run", llama, "--quiet", "--set", SIZES, "--data", "text:" + corpus, "--steps", "2", "--seed", "5",
           "--save", weights] + target_args() + mesh + ([] if hoisted else ["--no-hoist-constants"])
    losses = [s["loss"] for s in step_fields(cmd, tmp, 300, env=dict(os.environ, TMPDIR=tmp))]
    with open(weights, "rb") as f:
        return losses, f.read()


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: %s DMC SOURCE_ROOT\n" % sys.argv[0])
        return 2
    dmc, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    require_target()
    llama, corpus = os.path.join(root, "examples", "llama.dm"), os.path.join(root, "README.md")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        with open(llama) as f:
            text = f.read()
        unclipped = os.path.join(tmp, "llama.dm")
        with open(unclipped, "w") as f:
            f.write(text.replace(", clip = 1.0)", ")"))
        try:
            check_generated(dmc, llama, tmp, [], ["make_constants"])
            check_generated(dmc, llama, tmp, ["--mesh", "pipeline=2", "--microbatches", "2"],
                            ["stage0_constants", "stage1_constants"])
            check_generated(dmc, llama, tmp, ["--recompute", "full"], ["make_constants"])
        except Failure as e:
            failures.append(str(e))
        for mesh in MESHES:
            label = " ".join(mesh) or "serial"
            model = unclipped if "2bw" in mesh else llama
            try:
                got, want = train(dmc, model, tmp, corpus, mesh, True), train(dmc, model, tmp, corpus, mesh, False)
            except Failure as e:
                failures.append(str(e))
                continue
            same = got == want
            print("%-60s losses %s: %s, weights %s" % (label, got[0], "identical" if got[0] == want[0] else
                                                      "per step %s" % want[0], "identical" if got[1] == want[1]
                                                      else "DIFFER"))
            if not same:
                failures.append("%s: made at create vs per step: losses %s vs %s, weights %s" %
                                (label, got[0], want[0], "equal" if got[1] == want[1] else "differ"))
    for f in failures:
        print("FAIL: %s" % f, file=sys.stderr)
    if failures:
        return 1
    print("PASS: the tables only in create's functions; %d meshes bitwise as the per-step program" % len(MESHES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
