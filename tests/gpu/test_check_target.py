"""test_check_target.py DMC SRCROOT: `dmc --check --target cuda` agrees with `-o DIR --target cuda`.

What the CUDA dialect cannot do yet (its capabilities, codegen/dialect.h) code generation
refuses before it writes anything; --check runs the same refusals (codegen_check). For
each technique it refuses (none now: --prune RATIO:rows over attention heads, the last,
is built): --check and -o exit
with the same status (1) and print exactly the same stderr, which names the technique; the
C target accepts both. What CUDA does build is accepted by both too (meshes, checkpoints,
predict, ZeRO, the interleaved and asynchronous pipelines, compression, parameter servers,
--quantize's three modes, pruning element by element, by channels and by heads): its
generated descriptor then says that checkpoints and predict are there exactly where the C
target's does (`.checkpoints = 1`, no predict_unsupported, for most). Distillation (`dmc
run --teacher`, which -o refuses): --check accepts a student of several ranks (data=2;
data=2 x tensor=2 x pipeline=2) on both targets, and a student with parameter servers is
refused by --check and by `dmc run` with the same status and message. Needs no nvcc:
nothing is compiled.
"""
import os
import subprocess
import sys
import tempfile

GPT = ["--set", "V=64,T=16,C=32,NH=4,L=4,B=8"]


def cases(root):
    """(name, .dm, options, what the message says)."""
    return []


def model_of(dm):
    return os.path.splitext(os.path.basename(dm))[0]


def same_descriptor(cuda_source, c_source):
    """The CUDA program's descriptor says checkpoints and predict are there exactly where the
    C target's does (2bw's checkpoints are on neither; a model without outputs predicts on
    neither); problems, or []."""
    fields = []
    for path in (cuda_source, c_source):
        with open(path) as f:
            fields.append([line.strip() for line in f
                           if line.strip().startswith((".checkpoints", ".predict_unsupported"))])
    if not fields[1]:
        return ["the C target's descriptor has no checkpoints or predict_unsupported field"]
    return [] if fields[0] == fields[1] else ["the CUDA descriptor says %r where the C one says %r" % tuple(fields)]


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stderr


def check_distill(dmc, mlp, tmp):
    """Distillation's cases (above); the number failed."""
    weights = os.path.join(tmp, "teacher.safetensors")
    open(weights, "wb").close()  # --check only needs it readable
    teacher = ["--set", "H=64", "--teacher", mlp, "--teacher-init", weights]
    failures = 0
    for mesh in (["--mesh", "data=2"], ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "2"]):
        for target in ("cuda", "c"):
            rc, err = run([dmc, "--check", mlp, "--target", target] + mesh + teacher)
            ok = rc == 0
            print("%s distill %s --target %s: %s" % ("ok" if ok else "FAIL", " ".join(mesh), target,
                                                     "accepted" if ok else "exit %d: %r" % (rc, err)))
            failures += not ok
    servers = ["--target", "cuda", "--mesh", "data=2", "--param-servers", "1"] + teacher
    check = run([dmc, "--check", mlp] + servers)
    ran = run([dmc, "run", mlp] + servers + ["--steps", "1"])
    ok = check == ran and check[0] != 0 and "parameter servers" in check[1]
    print("%s distill with parameter servers: --check %r, run %r" % ("ok" if ok else "FAIL", check, ran))
    return failures + (not ok)


def main():
    dmc, root = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        mlp, gpt = os.path.join(root, "examples", "mlp.dm"), os.path.join(root, "examples", "gpt.dm")
        embed2bw = os.path.join(root, "tests", "ref", "embed2bw.dm")
        accepted = [("data=2", mlp, ["--mesh", "data=2"], None),
                    ("mlp-serial", mlp, [], None),
                    ("mlp-data2-tensor2", mlp, ["--mesh", "data=2,tensor=2"], None),
                    ("gpt-serial", gpt, GPT, None),
                    ("gpt-pipeline2", gpt, GPT + ["--mesh", "pipeline=2", "--microbatches", "4"], None),
                    ("dropout", os.path.join(root, "tests", "spmd", "dropout.dm"), ["--mesh", "data=2,tensor=2"], None),
                    ("bf16", mlp, ["--precision", "bf16"], None),
                    ("zero", mlp, ["--mesh", "data=2", "--zero", "1"], None),
                    ("interleaved", gpt, GPT + ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "interleaved",
                                                "--chunks", "2"], None),
                    ("zero-3", mlp, ["--mesh", "data=2", "--zero", "3"], None),
                    ("fp16", mlp, ["--precision", "fp16", "--mesh", "data=2"], None),
                    ("param-servers", mlp, ["--mesh", "data=2", "--param-servers", "1"], None),
                    ("compress-bf16", mlp, ["--mesh", "data=2", "--compress", "bf16"], None),
                    ("compress-powersgd", mlp, ["--mesh", "data=2", "--compress", "powersgd:2"], None),
                    ("prune", mlp, ["--prune", "0.5"], None),
                    ("prune-rows-data2", mlp, ["--prune", "0.5:rows", "--mesh", "data=2"], None),
                    ("prune-heads", gpt, GPT + ["--prune", "0.5:rows"], None),
                    ("2bw", embed2bw, ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw"], None),
                    ("pipedream", embed2bw, ["--mesh", "data=2,pipeline=3", "--microbatches", "4", "--schedule",
                                             "pipedream"], None),
                    ("quantize-int8-weights", mlp, ["--quantize", "int8-weights"], None),
                    ("quantize-int4-weights", mlp, ["--quantize", "int4-weights:32"], None),
                    ("quantize-int8", mlp, ["--quantize", "int8"], None),
                    ("quantize-int8-gpt", gpt, GPT + ["--quantize", "int8"], None)]
        for name, dm, opts, says in cases(root) + accepted:
            out = os.path.join(tmp, name)
            check = run([dmc, "--check", dm, "--target", "cuda"] + opts)
            emit = run([dmc, dm, "-o", out, "--target", "cuda"] + opts)
            problems = []
            if check != emit:
                problems.append("--check gave exit %d and %r, -o exit %d and %r" % (check + emit))
            if says is None and emit[0] != 0:
                problems.append("-o --target cuda refused it (exit %d): %r" % emit)
            if says is not None and (emit[0] != 1 or says not in emit[1]):
                problems.append("-o --target cuda should exit 1 saying %r, got exit %d and %r" % ((says,) + emit))
            for cmd in ([dmc, "--check", dm, "--target", "c"] + opts,
                        [dmc, dm, "-o", os.path.join(tmp, name + "-c"), "--target", "c"] + opts):
                rc, err = run(cmd)
                if rc != 0:
                    problems.append("the C target refused it (%s: exit %d): %r" % (cmd[1], rc, err))
            if says is None and emit[0] == 0 and not problems:
                problems += same_descriptor(os.path.join(out, model_of(dm) + ".cu"),
                                            os.path.join(tmp, name + "-c", model_of(dm) + ".c"))
            for p in problems:
                print("FAIL %s: %s" % (name, p))
            if not problems:
                print("ok %s: %s" % (name, (check[1].strip() or "accepted")))
            failures += bool(problems)
        failures += check_distill(dmc, mlp, tmp)
    print("%d cases failed" % failures if failures else "every case agrees")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
