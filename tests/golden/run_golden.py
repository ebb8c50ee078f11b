#!/usr/bin/env python3
"""run_golden.py: golden IR dumps of dmc.

    run_golden.py DMC [--update] [--known-bugs] [NAME ...]

For every case below, runs `DMC --emit=ir ARGS FILE` (FILE relative to the source
root) and compares stdout exactly with NAME.ir next to this script (a case whose ARGS
have --explain runs `DMC ARGS FILE` and compares with NAME.explain: the partition
plans); dmc must exit with
status 0 and print nothing on stderr (a case may name a warning it must print instead,
and no error). A mismatch prints a unified diff (golden ->
actual). --update rewrites the .ir files from dmc's current output: read every changed
golden before committing it (names, shapes, gradients). NAMEs restrict the run.

--known-bugs runs the cases of bugs/ instead: IR that is wrong today, with the golden
written by hand as it should be. They fail until the bug is fixed (meson test
golden-known-bugs); then move them up here.
"""
import argparse
import difflib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name -> (source file relative to the source root, extra dmc arguments)
CASES = {
    "mlp": ("examples/mlp.dm", ["--set", "B=4,H=8"]),
    "mlp.lower": ("examples/mlp.dm", ["--set", "B=4,H=8", "--stop-after=lower"]),
    "mlp.autodiff": ("examples/mlp.dm", ["--set", "B=4,H=8", "--stop-after=autodiff"]),
    "broadcast": ("tests/golden/broadcast.dm", []),
    "reduce": ("tests/golden/reduce.dm", []),
    "layout": ("tests/golden/layout.dm", []),
    "repeat": ("tests/golden/repeat.dm", []),
    "repeat.lower": ("tests/golden/repeat.dm", ["--set", "L=2", "--stop-after=lower"]),
    "alias": ("tests/golden/alias.dm", ["--stop-after=lower"]),
    "gpt.autodiff": ("examples/gpt.dm", ["--set", "V=64,T=16,C=32,NH=4,L=1,B=4", "--stop-after=autodiff"]),
    # the attention unfused: scores, causal softmax and product, and their three gradients
    "gpt.autodiff.unfused": ("examples/gpt.dm", ["--set", "V=64,T=16,C=32,NH=4,L=1,B=4", "--stop-after=autodiff",
                                                 "--no-fuse-attention"]),
    "transformer": ("tests/ref/ops/transformer.dm", []),
    # the optimizer line with a learning-rate schedule and clipping
    "clip.optimizer": ("tests/spmd/clip.dm", ["--stop-after=optimizer"]),
    # partition plans (--explain=full: every line): data parallel, Megatron's MLP (column then
    # row), both, and JSON
    "mlp.data2": ("examples/mlp.dm", ["--mesh", "data=2", "--explain=full"]),
    "mlp.data4": ("examples/mlp.dm", ["--mesh", "data=4", "--explain=full"]),
    "mlp.serial": ("examples/mlp.dm", ["--explain=full"]),
    "mlp.data2_tensor2": ("examples/mlp.dm", ["--mesh", "data=2,tensor=2", "--explain=full"]),
    # Megatron-LM's GPT: one allreduce forward and one backward per attention and MLP block
    # over tensor, the gradients over data; the vocabulary split too
    "gpt.data2_tensor2": ("examples/gpt.dm", ["--mesh", "data=2,tensor=2", "--explain=full"]),
    "megatron_mlp.data2_tensor2": ("tests/golden/megatron_mlp.dm", ["--explain=full"]),
    # the all-gather form, all-to-all, gathered weights, reduce-scattered gradients
    "forms.data2_tensor2": ("tests/spmd/forms.dm", ["--mesh", "data=2,tensor=2", "--explain=full"]),
    "megatron_mlp.tensor2": ("tests/golden/megatron_mlp.dm", ["--mesh", "data=1", "--explain=full"]),
    "megatron_mlp.json": ("tests/golden/megatron_mlp.dm", ["--explain=json"]),
    # pipelines: the cuts, each stage's cost, the schedule's grid and its bubble
    "gpt.pipeline4_m8": ("examples/gpt.dm", ["--mesh", "pipeline=4", "--microbatches", "8", "--set", "B=8", "--explain=full"]),
    "mlp.pipeline2_1f1b": ("examples/mlp.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4", "--schedule", "1f1b",
                                               "--explain=full"]),
    # 2bw: the stream's grid over three steps (no flush between them), a steady step's bubble
    # (only the unequal stages'), the warm-up once, the second weight version
    "mlp.pipeline2_2bw": ("examples/mlp.dm", ["--mesh", "pipeline=2", "--microbatches", "4", "--schedule", "2bw",
                                              "--set", "H=784", "--explain=full"]),
    "mlp.pipeline2_2bw.compact": ("examples/mlp.dm", ["--mesh", "data=2,pipeline=2", "--microbatches", "4",
                                                      "--schedule", "2bw", "--explain"]),
    # pipedream: the same stream, its weight versions (P - s on stage s) in the memory
    # (fc2, 63% of the work, is one stage: the unbalanced cut is warned of)
    "mlp.pipeline3_pipedream": ("examples/mlp.dm", ["--mesh", "pipeline=3", "--microbatches", "4", "--schedule",
                                                    "pipedream", "--explain=full"],
                                "warning: the pipeline stages dmc chose are unbalanced: stage 1 (fc2.matmul .. fc2)"),
    "mlp.accumulate4": ("examples/mlp.dm", ["--accumulate", "4", "--explain=full"]),
    # ZeRO: each bucket's shares, and the state (and gradients) per rank halved
    "mlp.data2_zero1": ("examples/mlp.dm", ["--mesh", "data=2", "--zero", "1", "--explain=full"]),
    # recomputation: the ops made again, and the smaller activation arena
    "gpt.recompute_full": ("examples/gpt.dm", ["--set", "B=8", "--mesh", "data=8", "--recompute", "full", "--explain=full"]),
    "gpt.data2_tensor2_zero2": ("examples/gpt.dm", ["--mesh", "data=2,tensor=2", "--zero", "2", "--explain=json"]),
    # ZeRO 3: parameters in shares, each bucket gathered before its first reader in the
    # forward and the backward pass (the next one prefetched), viewed in place
    "mlp.zero3": ("examples/mlp.dm", ["--set", "B=4,H=8", "--mesh", "data=2", "--zero", "3", "--bucket-mb", "0.0001"]),
    "mlp.data4_zero3": ("examples/mlp.dm", ["--mesh", "data=4", "--zero", "3", "--bucket-mb", "1", "--explain=full"]),
    # sequence parallelism: reduce-scatters and all-gathers along T, the rows kept split
    "gpt.data2_tensor2_seqpar": ("examples/gpt.dm", ["--set", "V=256,T=64,C=128,NH=4,L=2,B=4", "--mesh", "data=2,tensor=2",
                                               "--sequence-parallel", "--explain=full"]),
    "pipeline_cuts": ("tests/golden/pipeline_cuts.dm", ["--explain=full"]),
    "pipeline_cuts.json": ("tests/golden/pipeline_cuts.dm", ["--explain=json"]),
    # interleaved 1F1B: the chunks of each rank, the grid by rank, the bubble against
    # (P - 1) / (v M + P - 1); from the program's schedule statement, and from the options
    "interleaved": ("tests/golden/interleaved.dm", ["--explain=full"]),
    "interleaved.json": ("tests/golden/interleaved.dm", ["--explain=json"]),
    "gpt.pipeline2_interleaved2_m8": ("examples/gpt.dm", ["--mesh", "pipeline=2", "--microbatches", "8", "--set", "B=8",
                                                          "--schedule", "interleaved", "--chunks", "2", "--explain=full"]),
    # --explain's default, a screen at any size: names alike but for a layer index on one
    # line, collectives grouped by phase, axis and kind, memory a table of stages (the
    # cases above are --explain=full, every line)
    "gpt.data2_tensor2_pipeline2": ("examples/gpt.dm", ["--mesh", "data=2,tensor=2,pipeline=2", "--explain"]),
    "gpt.pipeline4_m8.compact": ("examples/gpt.dm", ["--mesh", "pipeline=4", "--microbatches", "8", "--set", "B=8",
                                                     "--explain"]),
    "forms.data2_tensor2.compact": ("tests/spmd/forms.dm", ["--mesh", "data=2,tensor=2", "--explain"]),
    "mlp.data4_zero3.compact": ("examples/mlp.dm", ["--mesh", "data=4", "--zero", "3", "--bucket-mb", "1", "--explain"]),
    # ZeRO 3 on a pipeline: the bucket holding the tied wte (read on stages 0 and 1) stays whole
    "gpt.data2_pipeline2_zero3.compact": ("examples/gpt.dm", ["--set", "V=256,T=64,C=128,NH=4,L=4,B=8", "--mesh",
                                                                "data=2,pipeline=2", "--zero", "3", "--explain"]),
    "mlp.serial.compact": ("examples/mlp.dm", ["--explain"]),
    "megatron_mlp.shard": ("tests/golden/megatron_mlp.dm", ["--set", "B=8,T=2,C=4", "--stop-after=shard"]),
}
# known bugs: goldens in bugs/, written by hand
KNOWN_BUGS = {
}
TIMEOUT_S = 30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dmc")
    ap.add_argument("--update", action="store_true", help="rewrite the .ir goldens")
    ap.add_argument("--known-bugs", action="store_true", help="run the cases of bugs/")
    ap.add_argument("names", nargs="*")
    opts = ap.parse_intermixed_args()
    dmc = os.path.abspath(opts.dmc)
    cases = KNOWN_BUGS if opts.known_bugs else CASES
    golden_dir = os.path.join(HERE, "bugs") if opts.known_bugs else HERE
    names = opts.names or sorted(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        print("run_golden: no such case: %s (cases: %s)" % (", ".join(unknown), ", ".join(sorted(cases))))
        return 2

    failed, updated = [], []
    for name in names:
        source, args, *warns = cases[name]
        explain = any(a.startswith("--explain") for a in args)
        golden_path = os.path.join(golden_dir, name + (".explain" if explain else ".ir"))
        cmd = [dmc] + ([] if explain else ["--emit=ir"]) + args + [source]
        try:
            p = subprocess.run(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failed.append(name)
            print("FAIL %s: did not finish within %d s" % (name, TIMEOUT_S))
            continue
        problems = []
        if p.returncode != 0:
            problems.append("exit status %d (command: %s)" % (p.returncode, " ".join(cmd[1:])))
        stderr = p.stderr.decode("utf-8", "replace")
        if warns and (warns[0] not in stderr or "error:" in stderr):
            problems.append("stderr without the warning '%s':\n%s" % (warns[0], stderr))
        elif p.stderr and not warns:
            problems.append("unexpected stderr:\n" + stderr)
        if opts.update and not problems:
            old = open(golden_path, "rb").read() if os.path.exists(golden_path) else None
            if old != p.stdout:
                with open(golden_path, "wb") as f:
                    f.write(p.stdout)
                updated.append(name)
            continue
        if not os.path.exists(golden_path):
            problems.append("no golden %s.ir (run with --update)" % name)
        else:
            with open(golden_path, "rb") as f:
                golden = f.read()
            if golden != p.stdout:
                diff = difflib.unified_diff(
                    golden.decode("utf-8", "replace").splitlines(True),
                    p.stdout.decode("utf-8", "replace").splitlines(True),
                    fromfile=name + ".ir", tofile=name + " (actual)")
                problems.append("IR differs from the golden:\n" + "".join(diff))
        if problems:
            failed.append(name)
            print("FAIL %s" % name)
            for prob in problems:
                print("  " + prob.rstrip("\n").replace("\n", "\n  "))

    for name in updated:
        print("updated %s" % name)
    print("run_golden: %d cases, %d failed%s" % (len(names), len(failed),
                                                  ", %d goldens updated" % len(updated) if opts.update else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
