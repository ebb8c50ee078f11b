"""test_valgrind.py DMC SRCROOT SCHEDULE_TEST: the pipeline's code paths are memcheck-clean.

Runs under `valgrind --error-exitcode=99` (memcheck: uninitialised reads, invalid
accesses, definite leaks):
  - dmc --explain on pipelines of gpt.dm, among them 10 stages over 4 layers (cuts
    inside layers: the case an uninitialised count once sent to the layer-only search,
    which then failed with "no cut ... fits 0 GiB" though no limit was given);
  - dmc -o of mlp.dm on data=2 x pipeline=2 with 1F1B (cuts, schedule, codegen);
  - dmc --explain of gpt.dm interleaved (2 ranks x 3 chunks, a memory limit);
  - tests/pipeline's schedule test;
  - one step of the generated mlp.dm trainer on pipeline=2 with 2 micro-batches (threads),
    and interleaved with 2 chunks (tagged sends, a rank's schedule over its chunks);
  - one step of a small gpt.dm trainer: its fused attention is libdmrt's kernels, and the
    baseline build links the base set of them alone (runtime/dmrt_attention.h; checked
    with nm before valgrind runs).
The trainers are built for the baseline instruction set (`dmc run --march x86-64`):
valgrind 3.19 cannot execute AVX-512, which -march=native emits on CPUs that have it.
Not registered in sanitized builds (valgrind cannot run ASan binaries). Exit 77 without
valgrind.
"""
import os
import shutil
import subprocess
import sys
import platform
import re
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import stio  # noqa: E402
import numpy as np  # noqa: E402

# what valgrind can execute on every x86-64 CPU (native code may hold AVX-512)
BASELINE = ["--march", "x86-64"] if platform.machine() in ("x86_64", "AMD64") else []
VALGRIND = ["valgrind", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
            "--track-origins=yes", "-q"]


def main(argv):
    dmc, root, schedule_test = os.path.abspath(argv[1]), os.path.abspath(argv[2]), os.path.abspath(argv[3])
    if not shutil.which("valgrind"):
        print("SKIP: valgrind is not installed")
        return 77
    gpt, mlp = os.path.join(root, "examples", "gpt.dm"), os.path.join(root, "examples", "mlp.dm")
    failures, runs = [], 0
    with tempfile.TemporaryDirectory(prefix="dmc-valgrind-") as tmp:
        keep = os.path.join(tmp, "pipe")
        batch = os.path.join(tmp, "batch.safetensors")
        rng = np.random.default_rng(0)
        stio.save({"x": rng.standard_normal((1, 16, 48)).astype(np.float32),
                   "y": rng.integers(0, 10, (1, 16)).astype(np.int32)}, batch)
        build = subprocess.run([dmc, "run", mlp, "--set", "B=16,D=48,H=64,K=10", "--mesh", "pipeline=2",
                                "--microbatches", "2", *BASELINE, "--keep", keep, "--steps", "0", "--quiet", "--batch-file", batch],
                               cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                               env=dict(os.environ, TMPDIR=tmp))
        keep_interleaved = os.path.join(tmp, "build-interleaved")
        build_interleaved = subprocess.run([dmc, "run", mlp, "--set", "B=16,D=48,H=64,K=10", "--mesh", "pipeline=2",
                                            "--microbatches", "2", "--schedule", "interleaved", "--chunks", "2", *BASELINE, "--keep",
                                            keep_interleaved, "--steps", "0", "--quiet", "--batch-file", batch],
                                           cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           universal_newlines=True, env=dict(os.environ, TMPDIR=tmp))
        # gpt.dm's fused attention: libdmrt's kernels for the baseline set (dmrt_attention.h
        # calls the set a build's flags allow; valgrind stops on an AVX-512 instruction)
        keep_gpt = os.path.join(tmp, "build-gpt")
        gpt_batch = os.path.join(tmp, "gpt-batch.safetensors")
        stio.save({"tokens": rng.integers(0, 64, (1, 2, 16)).astype(np.int32),
                   "targets": rng.integers(0, 64, (1, 2, 16)).astype(np.int32)}, gpt_batch)
        build_gpt = subprocess.run([dmc, "run", gpt, "--set", "V=64,T=16,C=32,NH=4,L=1,B=2", *BASELINE, "--keep", keep_gpt,
                                    "--steps", "0", "--quiet", "--batch-file", gpt_batch],
                                   cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   universal_newlines=True, env=dict(os.environ, TMPDIR=tmp))
        for b in (build, build_interleaved, build_gpt):
            if b.returncode != 0:
                print("FAIL: building the pipeline trainer: %s" % b.stderr)
                return 1
        # the baseline build links the base set alone (valgrind would not tell: at these
        # sizes the AVX-512 sets' loops run 256-bit instructions, which it executes)
        if BASELINE and shutil.which("nm"):
            symbols = subprocess.run(["nm", os.path.join(keep_gpt, "gpt")], stdout=subprocess.PIPE,
                                     universal_newlines=True, check=True).stdout
            sets = sorted(set(re.findall(r" T dmrt_attention_(?:forward|backward)(?:_grouped)?_(\w+)$", symbols, re.M)))
            print("gpt --march x86-64 links the attention kernels of the sets %s" % sets)
            if sets != ["base"]:
                print("FAIL: a --march x86-64 build must call libdmrt's base attention kernels alone")
                return 1
        cases = [
            ("explain gpt L=4 on 10 stages", [dmc, "--explain", gpt, "--set", "L=4,B=10,T=64,V=256,C=64,NH=4",
                                              "--mesh", "pipeline=10", "--microbatches", "10"]),
            ("explain gpt pipeline=4 1f1b", [dmc, "--explain=json", gpt, "--set", "B=8,T=64,V=256,C=64,NH=4",
                                             "--mesh", "pipeline=4", "--microbatches", "8", "--schedule", "1f1b"]),
            ("explain gpt memory limit", [dmc, "--explain", gpt, "--set", "B=8,T=64,V=256,C=64,NH=4", "--mesh",
                                          "pipeline=2", "--microbatches", "4", "--memory-gb", "1"]),
            ("codegen mlp data=2 x pipeline=2", [dmc, mlp, "--mesh", "data=2,pipeline=2", "--microbatches", "4",
                                                 "--schedule", "1f1b", "-o", os.path.join(tmp, "out")]),
            ("explain gpt interleaved, a limit", [dmc, "--explain=full", gpt, "--set", "B=8,T=64,V=256,C=64,NH=4",
                                                  "--mesh", "pipeline=2", "--microbatches", "4", "--schedule",
                                                  "interleaved", "--chunks", "3", "--memory-gb", "1"]),
            ("schedule test", [schedule_test]),
            ("trainer mlp pipeline=2, one step", [os.path.join(keep, "mlp"), "--batch-file", batch, "--steps", "1",
                                                  "--quiet"]),
            ("trainer mlp interleaved, one step", [os.path.join(keep_interleaved, "mlp"), "--batch-file", batch, "--steps",
                                                   "1", "--quiet"]),
            ("trainer gpt, fused attention, one step", [os.path.join(keep_gpt, "gpt"), "--batch-file", gpt_batch,
                                                        "--steps", "1", "--quiet"]),
        ]
        for name, cmd in cases:
            runs += 1
            r = subprocess.run(VALGRIND + cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               universal_newlines=True, timeout=900)
            ok = r.returncode == 0
            print("%-40s %s" % (name, "clean" if ok else "exit %d" % r.returncode))
            if not ok:
                failures.append("%s:\n%s" % (name, r.stderr[-6000:]))
    for f in failures:
        print("\n" + f)
    print("%d passed, %d failed" % (runs - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
