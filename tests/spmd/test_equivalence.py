"""test_equivalence.py DMC SRCROOT MODEL BACKEND: the serial program is the oracle of the
partitioned one.

MODEL is mlp (examples/mlp.dm, small sizes), dropout (tests/spmd/dropout.dm), gpt
(examples/gpt.dm, the tiny config: its vocabulary splits over tensor, so cross-entropy runs
vocabulary-parallel), forms
(tests/spmd/forms.dm: the all-gather form of the MLP, all-to-all, gathered weights,
reduce-scatter of gradients), stack, sgd, clip (tests/spmd/clip.dm: gradient clipping,
whose global norm counts every element once on each mesh, and a learning-rate schedule)
gated (tests/spmd/gated.dm: LLaMA's RMSNorm and SwiGLU MLP, tensor-parallel) rope
(tests/spmd/rope.dm: rotary embeddings, permute and concat over split dims) or llama
(examples/llama.dm, small sizes) or llama-gqa (the same with 2 key/value heads for 4);
BACKEND is threads or mpi; a fifth argument `pipeline` runs PIPELINE_MESHES instead of
MESHES (pipeline stages, micro-batches, accumulation; gpt.dm's embedding and its tied head on
different stages), `interleaved` INTERLEAVED_MESHES (interleaved 1F1B: v model chunks per
pipeline rank), `bf16` BF16_MESHES with every run, the serial one too, in --precision bf16, `fp16` the same
in fp16 with a loss scale that overflows (skipped steps),
`multihost` MULTIHOST_MESHES (run by tests/multihost across hosts made of
network namespaces). With $DMC_TEST_MPIRUN set, the mpi runs get it as their launcher
(`--mpirun "$DMC_TEST_MPIRUN"`): tests/multihost's mpirun over those hosts. For each mesh of MESHES, `dmc run --mesh M --backend BACKEND`
trains STEPS steps on the same batches (a --batch-file of random inputs) from the same
seed as the serial run (no --mesh: every axis has size 1, the serial program), and:
  - every step's loss equals the serial loss within LOSS_RTOL (relative);
  - the gradients of step 1, gathered whole (--dump-grads), equal the serial ones within
    GRAD_ATOL (absolute, every element);
  - the final weights, gathered whole and saved by rank 0 (--save), equal the serial ones
    within WEIGHT_ATOL[model] (absolute, every element of every parameter). AdamW divides
    each gradient element by its running RMS, so where a gradient is about as small as
    its float32 rounding (GELU's flat tail gives such elements in the GPT), a difference
    in the last bit of the gradient moves that weight by up to lr per step: the GPT's
    bound is a fraction of lr (1e-3) rather than 1e-5.
Prints the worst differences it saw. Exit 77 (a meson skip) for mpi without mpirun.
"""
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
from dmcrun import TARGET, Failure, nan_worst, run_dmc_steps  # noqa: E402

STEPS = 10
LOSS_RTOL = 1e-5
GRAD_ATOL = 1e-6
WEIGHT_ATOL = {"mlp": 1e-6, "gpt": 1e-4, "forms": 1e-6, "stack": 1e-6, "sgd": 1e-6, "clip": 1e-6, "dropout": 1e-6, "gated": 1e-6,
               "rope": 1e-6, "llama": 1e-4, "llama-gqa": 1e-4}
# (mesh, extra dmc arguments): the last runs with buckets of 4 KiB, so that most gradient
# buckets are started during the backward pass and overlap it
MESHES = [("data=2", []), ("data=4", []), ("tensor=2", []), ("tensor=4", []), ("data=2,tensor=2", []),
          ("data=2", ["--bucket-mb", "0.004"]),
          # ZeRO: optimizer state (1), and gradients (2), and parameters (3, gathered bucket by
          # bucket before their readers) in shares over data; small buckets make shares begin
          # and end inside tensors, and many gathers prefetch the next; the last with every
          # layer call recomputed in the backward pass (which then reads the gathered copies)
          ("data=2", ["--zero", "1"]), ("data=4", ["--zero", "2", "--bucket-mb", "0.004"]),
          ("data=2,tensor=2", ["--zero", "2"]),
          ("data=2,tensor=2", ["--zero", "3", "--bucket-mb", "0.004", "--recompute", "full"])]

# pipelines and micro-batches (MESH_SET pipeline): accumulation without a mesh, 2 and 4
# stages with 1, 4 and 8 micro-batches under both schedules, and pipelines composed with
# data and tensor parallelism (data=2 x tensor=2 x pipeline=2: 8 ranks)
PIPELINE_MESHES = [("data=1", ["--accumulate", "4"]),
                   # each micro-batch's gradient summed where computed, the buckets reading the sum
                   ("data=2", ["--accumulate", "4"]),
                   ("pipeline=2", ["--microbatches", "1"]),
                   ("pipeline=2", ["--microbatches", "4"]),
                   ("pipeline=2", ["--microbatches", "8", "--schedule", "1f1b"]),
                   ("pipeline=4", ["--microbatches", "8"]),
                   ("pipeline=4", ["--microbatches", "4", "--schedule", "1f1b"]),
                   ("data=2,pipeline=2", ["--microbatches", "4", "--schedule", "1f1b"]),
                   ("data=2,tensor=2,pipeline=2", ["--microbatches", "4"]),
                   ("data=2,tensor=2,pipeline=2", ["--microbatches", "4", "--schedule", "1f1b"]),
                   # ZeRO on pipeline stages, with the micro-batches' gradients summed whole
                   ("data=2,pipeline=2", ["--microbatches", "4", "--zero", "1"]),
                   ("data=2,tensor=2,pipeline=2", ["--microbatches", "4", "--schedule", "1f1b", "--zero", "2"]),
                   ("data=2,tensor=2,pipeline=2", ["--microbatches", "4", "--schedule", "1f1b", "--zero", "3",
                                                   "--bucket-mb", "0.004"])]
# interleaved 1F1B (--chunks v: the model cut into P v stages, stage j on pipeline rank j mod
# P): 2 and 3 chunks on 2 ranks, 2 on 4 (8 stages: gpt.dm's 4 blocks, embedding and head
# each a stage or part of one), M = P (every rank warms up with all its forwards), the
# tied embedding on rank 0's first chunk and the head on rank P-1's last, and with data
# and tensor parallelism and recomputation (8 ranks)
INTERLEAVED_MESHES = [("pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"]),
                      ("pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "3"]),
                      ("pipeline=2", ["--microbatches", "2", "--schedule", "interleaved", "--chunks", "2"]),
                      ("pipeline=4", ["--microbatches", "8", "--schedule", "interleaved", "--chunks", "2"]),
                      ("data=2,pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2",
                                             "--zero", "2", "--bucket-mb", "0.004"]),
                      ("data=2,pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2",
                                             "--zero", "3", "--bucket-mb", "0.004"]),
                      ("data=2,tensor=2,pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2",
                                                      "--recompute", "full"])]
# sequence parallelism (--sequence-parallel, MESH_SET seqpar): the rows between tensor-parallel
# products split over tensor (gpt.dm's sequence T, dropout.dm's batch on tensor=2), alone, with
# data parallelism, with ZeRO 2 and 3 (and every layer call recomputed), with pipeline stages
# (GPipe, 1F1B, interleaved), with selective recomputation and with --no-fuse-attention
SEQUENCE_MESHES = [("tensor=2", ["--sequence-parallel"]), ("tensor=4", ["--sequence-parallel"]),
                   ("data=2,tensor=2", ["--sequence-parallel"]),
                   ("data=2,tensor=2", ["--sequence-parallel", "--zero", "2"]),
                   ("data=2,tensor=2", ["--sequence-parallel", "--zero", "3", "--bucket-mb", "0.004",
                                        "--recompute", "full"]),
                   ("tensor=2", ["--sequence-parallel", "--no-fuse-attention"]),
                   ("tensor=2", ["--sequence-parallel", "--recompute", "selective"]),
                   ("tensor=2,pipeline=2", ["--sequence-parallel", "--microbatches", "2"]),
                   ("tensor=2,pipeline=2", ["--sequence-parallel", "--microbatches", "4", "--schedule", "interleaved",
                                            "--chunks", "2"]),
                   ("data=2,tensor=2,pipeline=2", ["--sequence-parallel", "--microbatches", "2", "--schedule", "1f1b"])]
# across hosts (tests/multihost, MESH_SET multihost, ranks dealt round-robin over the hosts,
# TCP between every two ranks): data x tensor, data x tensor x pipeline (1F1B), ZeRO 3 over
# data with small buckets (shares begin and end inside tensors, gathers prefetched), and ZeRO 3
# on data x tensor with every layer call recomputed
MULTIHOST_MESHES = [("data=2,tensor=2", []),
                    ("data=2,tensor=2,pipeline=2", ["--microbatches", "4", "--schedule", "1f1b"]),
                    ("data=4", ["--zero", "3", "--bucket-mb", "0.004"]),
                    MESHES[-1]]
# DMC_TEST_QUICK=1 (the sanitized build, tests/meson.build): the most composed of each list,
# which reach the collectives, ZeRO's shares, recomputation and both schedules
QUICK_MESHES = [MESHES[4], MESHES[-1]]
QUICK_PIPELINE_MESHES = [PIPELINE_MESHES[3], PIPELINE_MESHES[-2]]
QUICK_INTERLEAVED_MESHES = [INTERLEAVED_MESHES[0], INTERLEAVED_MESHES[-1]]
QUICK_SEQUENCE_MESHES = [SEQUENCE_MESHES[2], SEQUENCE_MESHES[-1]]
# --precision bf16 (MESH_SET bf16): the serial run and every mesh in bf16, each mesh against
# serial bf16: data, tensor, both, ZeRO 3 with recomputation, pipelines under both schedules
# with data and tensor parallelism. The products' operands are rounded alike on every mesh;
# only the sums' order differs (a tensor-parallel product's partial sums), which moves an
# operand across a bf16 rounding boundary now and then: a 2^-8 change of one operand. The
# GPT's tensor-parallel meshes measured 1.1e-5 in the losses, 1.5e-5 in a gradient and,
# AdamW moving a weight by up to lr a step where its gradient is near zero, 1.9e-3 in a
# weight: BF16_BOUNDS (loss, gradient, weight) with a few times that room. The MLP stayed
# within the f32 bounds on the AVX-512 EPYC they were set on; on an AVX2 EPYC, whose OpenBLAS
# sums a product of a data=2 rank's rows in another order than the whole batch's, an operand
# flips at step 3 and the losses part by 4.1e-5 (bf16) by step 10, a weight by 1.8e-5
# (fp16), the step-1 gradients by 6e-8: the MLP's bounds have the same room. A cast left out
# or a product in f32 on one mesh is off by the distance of bf16 from f32 (test_bf16.py:
# 7e-4 in the step-1 loss).
BF16_MESHES = [MESHES[0], MESHES[2], MESHES[4], MESHES[-1], PIPELINE_MESHES[0], PIPELINE_MESHES[4],
               PIPELINE_MESHES[9]]
BF16_BOUNDS = {"mlp": (2e-4, 1e-6, 1e-3), "gpt": (5e-5, 1e-4, 5e-3), "clip": (2e-4, 1e-6, 1e-3)}
# fp16 adds the interleaved schedule: a rank's model chunks are one model to the loss
# scaler, so a step is skipped (and the scale halved once) on every chunk of every rank or
# on none: data=2 x pipeline=2 with 2 chunks of 2 micro-batches, and 3 chunks of 4
# micro-batches (2 of mlp.dm's 6 stages hold no parameter). Before 2026-11-30 each chunk
# decided alone: a skip halved the scale once per chunk and the skipped count ran ahead of
# the steps (AdamW's bias correction then took a negative update count: a NaN loss by step 6).
FP16_MESHES = BF16_MESHES + [("data=2,pipeline=2", ["--microbatches", "2", "--schedule", "interleaved", "--chunks", "2"]),
                             ("pipeline=2", ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "3"])]
# sizes for the pipeline meshes where a model's own do not fit them: gpt.dm's batch must
# split into 8 micro-batches, and 4 layers give pipeline=4 a layer a stage (the token
# embedding on the first stage and the head tied to it on the last)
PIPELINE_SIZES = {"gpt": "V=64,T=16,C=32,NH=4,L=4,B=8", "llama": "V=64,T=8,C=32,NH=4,F=48,L=4,B=8"}
MODELS = {
    # batch 16 divides over data=4; hidden 64 over tensor=4
    "mlp": ("examples/mlp.dm", "B=16,D=48,H=64,K=10"),
    # batch 4 over data=4; 4 heads and 4C over tensor=4
    "gpt": ("examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=2,B=4"),
    # batch 16 over data=2 x tensor=2 (the rows split over tensor too), hidden 32 and
    # classes 8 over tensor=4
    "forms": ("tests/spmd/forms.dm", "B=16,D=24,H=32,K=8"),
    # four residual blocks and a head: a layer per stage on pipeline=4
    "stack": ("tests/spmd/stack.dm", "B=16,D=32,H=64,K=8"),
    # stack.dm with dropout (on the input, the hidden units split over tensor, each block's
    # output): every rank draws the serial program's mask for its block of each tensor
    "dropout": ("tests/spmd/dropout.dm", "B=16,D=32,H=64,K=8"),
    # SGD with Nesterov momentum: one state tensor per parameter (ZeRO's shares of it)
    "sgd": ("tests/spmd/sgd.dm", "B=16,D=24,H=32,K=8"),
    # gradient clipping (its global norm over every mesh) under a warmup and cosine decay
    "clip": ("tests/spmd/clip.dm", "B=16,D=24,H=32,K=8"),
    # RMSNorm (a kept-dim mean, rsqrt), SwiGLU (silu) split over tensor, a norm over a
    # split width
    "gated": ("tests/spmd/gated.dm", "B=16,D=32,H=64,K=8"),
    # rotary embeddings: permute moving split heads, rotate_half's concat along a whole
    # dim, a concat along a dim split over tensor, sin and cos of a parameter's table
    "rope": ("tests/spmd/rope.dm", "B=16,D=32,H=64,K=8"),
    # LLaMA (examples/llama.dm): RoPE tables from arange in every attention, heads split
    # over tensor through permute, SwiGLU, RMSNorm, the vocabulary split; batch 4 over
    # data=4, 4 heads, F and V over tensor=4
    "llama": ("examples/llama.dm", "V=64,T=8,C=32,NH=4,F=48,L=2,B=4"),
    # the same with grouped-query attention: 2 key/value heads for 4 query heads (repeat_kv
    # by broadcasting); on tensor=2 they split like the query heads, on tensor=4 they do not
    # divide and are redistributed
    "llama-gqa": ("examples/llama.dm", "V=64,T=8,C=32,NH=4,NKV=2,F=48,L=2,B=4"),
}


def batches(model, sizes, rng):
    """STEPS batches of random inputs, one tensor per input with a leading step dim."""
    dims = dict(kv.split("=") for kv in sizes.split(","))
    dims = {k: int(v) for k, v in dims.items()}
    if model in ("mlp", "forms", "stack", "sgd", "clip", "dropout", "gated", "rope"):
        b, d, k = dims["B"], dims["D"], dims["K"]
        return {"x": rng.standard_normal((STEPS, b, d)).astype(np.float32),
                "y": rng.integers(0, k, (STEPS, b)).astype(np.int32)}
    b, t, v = dims["B"], dims["T"], dims["V"]
    return {"tokens": rng.integers(0, v, (STEPS, b, t)).astype(np.int32),
            "targets": rng.integers(0, v, (STEPS, b, t)).astype(np.int32)}


def train(dmc, dm_file, tmp, sizes, batch_file, mesh, backend, tag, extra=(), everywhere=()):
    """Losses, step-1 gradients, final weights and each step's loss scale and skip (fp16's
    scaler: (scale, skipped) per step; None elsewhere) of STEPS steps on mesh (None:
    serial); everywhere: arguments of the serial run and the mesh's alike."""
    saved = os.path.join(tmp, "weights-%s.safetensors" % tag)
    grads = os.path.join(tmp, "grads-%s.safetensors" % tag)
    args = ["--set", sizes, "--batch-file", batch_file, "--steps", str(STEPS), "--seed", "7",
            "--save", saved, "--dump-grads", grads] + list(everywhere)
    if mesh:
        args += ["--mesh", mesh, "--backend", backend] + list(extra)
        if backend == "mpi" and os.environ.get("DMC_TEST_MPIRUN"):
            args += ["--mpirun", os.environ["DMC_TEST_MPIRUN"]]
    steps = run_dmc_steps(dmc, dm_file, tmp, args, timeout=300)
    if len(steps) != STEPS:
        raise Failure("%s: %d step lines, expected %d" % (tag, len(steps), STEPS))
    scaler = [(f["scale"], f.get("skipped", 0.0)) for f in steps] if "scale" in steps[0] else None
    return [f["loss"] for f in steps], stio.load(grads), stio.load(saved), scaler


def max_difference(tag, got, want):
    """The largest absolute difference over every element of every tensor, and where."""
    if sorted(got) != sorted(want):
        raise Failure("%s: saved tensors %s, serial saved %s" % (tag, sorted(got), sorted(want)))
    worst, worst_name = 0.0, "-"
    for name, w in want.items():
        if got[name].shape != w.shape:
            raise Failure("%s: %s has shape %s, serial %s" % (tag, name, got[name].shape, w.shape))
        err = nan_worst(float(np.max(np.abs(got[name] - w))) if w.size else 0.0)
        if err > worst:
            worst, worst_name = err, name
    return worst, worst_name


def main():
    global MESHES
    dmc, root, model, backend = sys.argv[1:5]
    mesh_set = sys.argv[5] if len(sys.argv) > 5 else ""
    pipeline = mesh_set in ("pipeline", "interleaved")
    if pipeline:
        MESHES = INTERLEAVED_MESHES if mesh_set == "interleaved" else PIPELINE_MESHES
    if mesh_set == "seqpar":
        MESHES = SEQUENCE_MESHES
    if mesh_set == "multihost":
        MESHES = MULTIHOST_MESHES

    if os.environ.get("DMC_TEST_QUICK") == "1":
        print("DMC_TEST_QUICK: %d of the %d meshes" % (2, len(MESHES)))
        if mesh_set == "seqpar":
            MESHES = QUICK_SEQUENCE_MESHES
        elif not pipeline:
            MESHES = QUICK_MESHES
        else:
            MESHES = QUICK_INTERLEAVED_MESHES if mesh_set == "interleaved" else QUICK_PIPELINE_MESHES
    everywhere = []  # what every run gets, the serial one too
    global LOSS_RTOL, GRAD_ATOL
    if mesh_set in ("bf16", "fp16"):
        LOSS_RTOL, GRAD_ATOL, WEIGHT_ATOL[model] = BF16_BOUNDS[model]
        MESHES = FP16_MESHES if mesh_set == "fp16" else BF16_MESHES
        if os.environ.get("DMC_TEST_QUICK") == "1":
            MESHES = [BF16_MESHES[2], BF16_MESHES[-1]] + ([FP16_MESHES[-2]] if mesh_set == "fp16" else [])
        everywhere = ["--precision", mesh_set]
    if mesh_set == "fp16":
        # a loss scale that overflows the first steps' half gradients: every rank must skip
        # the same steps (one check over the mesh) and grow the scale alike
        everywhere += ["--loss-scale", "67108864", "--loss-scale-interval", "4"]
    if backend == "mpi" and not shutil.which("mpirun"):
        print("SKIP: mpirun is not installed")
        return 77
    dm_file, sizes = MODELS[model]
    if pipeline or mesh_set in ("bf16", "fp16"):
        sizes = PIPELINE_SIZES.get(model, sizes)
    dm_file = os.path.join(os.path.abspath(root), dm_file)
    tmp = tempfile.mkdtemp(prefix="dmc-spmd-")
    failures = []
    try:
        batch_file = os.path.join(tmp, "batches.safetensors")
        stio.save(batches(model, sizes, np.random.default_rng(3)), batch_file)
        serial = {1: train(dmc, dm_file, tmp, sizes, batch_file, None, backend, "serial", everywhere=everywhere)}
        for mesh, extra in MESHES:
            tag = "%s %s %s %s" % (model, backend, mesh, " ".join(extra))
            # fp16: a micro-batch's gradients are its own mean's, M times a whole batch's, so
            # they overflow at another scale: the reference is the serial run of M micro-batches
            micro = 1
            for flag in ("--microbatches", "--accumulate"):
                if mesh_set == "fp16" and flag in extra:
                    micro = int(extra[extra.index(flag) + 1])
            if micro not in serial:
                serial[micro] = train(dmc, dm_file, tmp, sizes, batch_file, None, backend, "serial-m%d" % micro,
                                      everywhere=everywhere + ["--accumulate", str(micro)])
            want_losses, want_grads, want_weights, want_scaler = serial[micro]
            try:
                losses, grads, weights, scaler = train(dmc, dm_file, tmp, sizes, batch_file, mesh, backend,
                                                       (mesh + "_".join(extra)).replace(",", "_"), extra, everywhere)
                loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
                # fp16: step 1's update was skipped, its gradients scaled and overflowed (their
                # infinities and NaNs fall where each mesh's products put them): not compared
                grad_err, grad_name = max_difference(tag, grads, want_grads) if mesh_set != "fp16" else (0.0, "-")
                weight_err, weight_name = max_difference(tag, weights, want_weights)
                print("%-34s losses %.1e (bound %.0e), step-1 grads %.1e (%.0e) in %s, weights %.1e (%.0e) in %s"
                      % (tag, loss_err, LOSS_RTOL, grad_err, GRAD_ATOL, grad_name, weight_err,
                         WEIGHT_ATOL[model], weight_name))
                # fp16: the same steps skipped and the same scale after each, exactly (a scaler
                # deciding per stage or per chunk halves it more than once a step, or skips
                # another set of steps)
                if scaler != want_scaler:
                    raise Failure("%s: loss scale and skips per step %s vs serial %s" % (tag, scaler, want_scaler))
                if loss_err > LOSS_RTOL:
                    raise Failure("%s: losses %s vs serial %s" % (tag, losses, want_losses))
                if grad_err > GRAD_ATOL:
                    raise Failure("%s: the gradient of %s differs from the serial run by %.3g" % (tag, grad_name, grad_err))
                if weight_err > WEIGHT_ATOL[model]:
                    raise Failure("%s: %s differs from the serial run by %.3g" % (tag, weight_name, weight_err))
            except Failure as e:
                print("FAIL %s" % e)
                failures.append(mesh)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (len(MESHES) - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
