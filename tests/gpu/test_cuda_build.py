"""test_cuda_build.py DMC SRCROOT [QUICK]: the CUDA target builds, on any machine.

For mlp.dm and gpt.dm (the tiny config, and GPT-2 124M as the .dm declares it) on the
serial program and on data=2, tensor=2, data=2 x tensor=2 and pipeline=2 meshes (gpt.dm's
embedding and the head tied to it then on different stages), for tests/spmd/forms.dm
(which all-gathers integer labels) on data=2 x tensor=2 and for tests/spmd/clip.dm
(gradient clipping) serial, on data=2 x tensor=2 and pipeline=2, for tests/spmd/gated.dm (silu,
rsqrt, RMSNorm's kept-dim mean), tests/spmd/rope.dm (sin, cos, concat, permute, arange)
and examples/llama.dm (small sizes) on data=2 x tensor=2 (also with grouped-query
attention, 2 kv heads for 4, and so in bf16 serial: the .cu is checked for the _grouped
attention calls), tests/spmd/dropout.dm on data=2 x
tensor=2 and pipeline=2 (2 micro-batches), --precision bf16 (mlp.dm on data=2 x tensor=2, gpt.dm
serial) and fp16 (gpt.dm on pipeline=2) (gpt.dm's fused attention then calls cuDNN's,
runtime/cuda/attention16.cu, forward and backward: the .cu is checked for both calls, and a
32-bit gpt.dm or llama.dm for the f32 kernel's instead; gpt.dm's are the _inner calls, its
heads' transposes folded into the attention), ZeRO 1, 2 (with clipping) and 3 (with a checkpoint) on data=2,
the interleaved schedule (gpt.dm, 4 layers on pipeline=2 x 2 chunks; clip.dm so, with its
clipping, under fp16 too, and on data=2 x pipeline=2 with ZeRO 3), 2bw (mlp.dm on data=2 x
pipeline=2, gpt.dm on pipeline=2) and pipedream (gpt.dm on pipeline=3, wte tied across it),
gradient compression (bf16, topk and powersgd on data=2, powersgd on data=2 x pipeline=2, topk
there interleaved, bf16 with ZeRO 2),
parameter servers (mlp.dm with 2, gpt.dm with 1 and staleness 1, on data=2), --prune
(mlp.dm element by element, by rows and on data=2; gpt.dm element by element and by
attention heads), sequence
parallelism (gpt.dm on data=2 x tensor=2) and recomputation (gpt.dm on data=2),
--quantize int8-weights, int4-weights:32 and int8 (mlp.dm and gpt.dm, serial; llama.dm's
int8-weights and int8, its weights read transposed; these run
--predict, or int8 calibrates and --save-quantized, instead of a training step),
for distillation
(tests/ref/test_distill.py's students and teachers, both compiled by nvcc into one program:
serial, data=2, and data=2 x tensor=2 x pipeline=2 with micro-batches), and
for checkpoints (--checkpoint; every case's file also has <model>_predict and the optimizer state's moves),
`dmc run --target cuda --keep DIR` must
  - write DIR/<model>.cu that nvcc compiles with every warning an error (dmc run passes
    -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-ffp-contract=off), and link it with libdmrt_cuda,
    cuBLAS and NCCL into DIR/<model> (also with mpicc for --backend mpi);
  - then, without a GPU, fail with exit 1 and "no CUDA device" in its message (and not
    crash); with one, train a step and print its loss (a quantized program: write its
    output file).
Each run reads one step of random inputs from a --batch-file. QUICK (the sanitized
build) skips the 124M compile, the slowest. Registered only when dmc was built with the
CUDA toolkit (tests/gpu/meson.build).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import stio  # noqa: E402
from dmcrun import gpu_count  # noqa: E402
from test_quantize_int8 import write_fashion_mnist  # noqa: E402
import test_distill  # noqa: E402

TINY_GPT = "V=64,T=16,C=32,NH=4,L=2,B=4"
SMALL_MLP = "B=16,D=48,H=64,K=10"
# (name, .dm, --set, mesh, extra dmc arguments, expected build error or None)
CASES = [
    ("mlp-serial", "examples/mlp.dm", SMALL_MLP, None, [], None),
    ("mlp-data2", "examples/mlp.dm", SMALL_MLP, "data=2", [], None),
    ("mlp-tensor2", "examples/mlp.dm", SMALL_MLP, "tensor=2", [], None),
    ("mlp-data2-tensor2", "examples/mlp.dm", SMALL_MLP, "data=2,tensor=2", [], None),
    ("mlp-pipeline2", "examples/mlp.dm", SMALL_MLP, "pipeline=2", ["--microbatches", "4", "--schedule", "1f1b"], None),
    ("mlp-accumulate", "examples/mlp.dm", SMALL_MLP, None, ["--accumulate", "2"], None),
    # gradient buckets reduced during the backward pass (the update then reads no partials)
    ("mlp-data2-buckets", "examples/mlp.dm", SMALL_MLP, "data=2", ["--bucket-mb", "0.004"], None),
    # an all-gather of integer labels (collectives move them as floats, bit for bit)
    ("forms-data2-tensor2", "tests/spmd/forms.dm", "B=16,D=24,H=32,K=8", "data=2,tensor=2", [], None),
    # gradient clipping (its norm and scaling on the device) and a learning-rate schedule
    ("clip-data2-tensor2", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "data=2,tensor=2", [], None),
    # serial: the norm, the factor and the scaling on the device, without a wait
    ("clip-serial", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", None, [], None),
    ("clip-pipeline2", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "pipeline=2", ["--microbatches", "2"], None),
    # LLaMA's pieces: silu, rsqrt, a kept-dim mean (RMSNorm), a norm over a split width
    ("gated-data2-tensor2", "tests/spmd/gated.dm", "B=16,D=32,H=64,K=8", "data=2,tensor=2", [], None),
    # rotary embeddings: sin, cos, concat (pads assembled in place), permute
    ("rope-data2-tensor2", "tests/spmd/rope.dm", "B=16,D=32,H=64,K=8", "data=2,tensor=2", [], None),
    # examples/llama.dm: RoPE tables from arange, SwiGLU, RMSNorm, heads over tensor; two
    # micro-batches, whose embedding gradient (its vocabulary split) is made in its sum
    ("llama-data2-tensor2", "examples/llama.dm", "V=64,T=8,C=32,NH=4,F=48,L=2,B=4", "data=2,tensor=2",
     ["--accumulate", "2"], None),
    # grouped-query attention: k and v at 2 heads for 4 read by the _grouped attention calls
    # (the f32 kernel; in bf16 cuDNN's graph after k and v repeated by the cast)
    ("llama-gqa-data2-tensor2", "examples/llama.dm", "V=64,T=8,C=32,NH=4,NKV=2,F=48,L=2,B=4", "data=2,tensor=2", [],
     None),
    ("llama-gqa-bf16", "examples/llama.dm", "V=64,T=8,C=32,NH=4,NKV=2,F=48,L=2,B=4", None, ["--precision", "bf16"],
     None),
    # dropout: its mask drawn per element on the device (runtime/cuda/dropout.cu), split
    # over tensor between tensor-parallel products and over micro-batches
    ("dropout-data2-tensor2", "tests/spmd/dropout.dm", "B=16,D=32,H=64,K=8", "data=2,tensor=2", [], None),
    ("dropout-pipeline2", "tests/spmd/dropout.dm", "B=16,D=32,H=64,K=8", "pipeline=2", ["--microbatches", "2"], None),
    # 16-bit products (cuBLAS's bf16 and fp16 GEMMs, the casts' kernels) and fp16's loss scaling
    ("mlp-bf16-data2-tensor2", "examples/mlp.dm", SMALL_MLP, "data=2,tensor=2", ["--precision", "bf16"], None),
    ("gpt-fp16-pipeline2", "examples/gpt.dm", TINY_GPT, "pipeline=2", ["--precision", "fp16", "--microbatches", "2"], None),
    # the fused attention in bf16 through cuDNN (runtime/cuda/cudnn_sdpa.c), linked with -lcudnn
    ("gpt-bf16-cudnn", "examples/gpt.dm", TINY_GPT, None, ["--precision", "bf16"], None),
    # ZeRO 1, 2 and 3: reduce-scatters, shard updates and all-gathers on the device (ZeRO 3's
    # started), shares moved through host memory for init, saves and checkpoints
    ("mlp-data2-zero1", "examples/mlp.dm", SMALL_MLP, "data=2", ["--zero", "1"], None),
    ("mlp-data2-zero2-clip", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "data=2", ["--zero", "2"], None),
    ("gpt-data2-zero3", "examples/gpt.dm", TINY_GPT, "data=2", ["--zero", "3", "--bucket-mb", "0.01", "--checkpoint", "ckpt-z3"],
     None),
    # sequence parallelism (reduce-scatters and all-gathers along T) and recomputation (the
    # forward's ops again in the backward, from checkpointed values), with two micro-batches:
    # the tied wte's sum made by the head's product and the embedding gradient's rows
    ("gpt-data2-tensor2-seqpar", "examples/gpt.dm", TINY_GPT, "data=2,tensor=2", ["--sequence-parallel"], None),
    ("gpt-data2-recompute", "examples/gpt.dm", TINY_GPT, "data=2", ["--recompute", "full", "--accumulate", "2"], None),
    # the interleaved schedule: tagged sends between a pair of ranks, staged
    ("gpt-pipeline2-interleaved", "examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=4,B=8", "pipeline=2",
     ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"], None),
    # and with clipping: each chunk's squares into its rank's sum, the rank's factor
    ("clip-pipeline2-interleaved", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "pipeline=2",
     ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2"], None),
    # fp16's loss scaler with clipping, interleaved: the squares of scaled gradients over scale^2
    ("clip-pipeline2-interleaved-fp16", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "pipeline=2",
     ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2", "--precision", "fp16"], None),
    # ZeRO 3 on interleaved chunks, clipped: each chunk's shares, its squares in its rank's sum
    ("clip-data2-pipeline2-interleaved-zero3", "tests/spmd/clip.dm", "B=16,D=24,H=32,K=8", "data=2,pipeline=2",
     ["--microbatches", "4", "--schedule", "interleaved", "--chunks", "2", "--zero", "3"], None),
    # the asynchronous pipelines: weight versions copied on the device, the previous batch's
    # inputs kept there (input_X pointed at them in an owed backward), and gpt.dm's tied
    # wte sent between the stages' copies (pipedream: before the forward that reads it)
    ("mlp-data2-pipeline2-2bw", "examples/mlp.dm", SMALL_MLP, "data=2,pipeline=2",
     ["--microbatches", "2", "--schedule", "2bw"], None),
    ("gpt-pipeline2-2bw", "examples/gpt.dm", TINY_GPT, "pipeline=2", ["--microbatches", "2", "--schedule", "2bw"], None),
    ("gpt-pipeline3-pipedream", "examples/gpt.dm", "V=64,T=16,C=32,NH=4,L=2,B=6", "pipeline=3",
     ["--microbatches", "3", "--schedule", "pipedream"], None),
    # gradient compression, staged through host memory (the C target's results bit for bit):
    # 16-bit values, top-k with its residual, PowerSGD with its Q factors drawn at create
    ("mlp-data2-compress-bf16", "examples/mlp.dm", SMALL_MLP, "data=2", ["--compress", "bf16"], None),
    ("mlp-data2-compress-topk", "examples/mlp.dm", SMALL_MLP, "data=2", ["--compress", "topk:0.1"], None),
    ("gpt-data2-compress-powersgd", "examples/gpt.dm", TINY_GPT, "data=2", ["--compress", "powersgd:2"], None),
    # ZeRO 2 under bf16 compression: its reduce-scatters in 16 bits, staged
    ("mlp-data2-zero2-compress-bf16", "examples/mlp.dm", SMALL_MLP, "data=2", ["--zero", "2", "--compress", "bf16"], None),
    ("mlp-data2-pipeline2-compress", "examples/mlp.dm", SMALL_MLP, "data=2,pipeline=2",
     ["--microbatches", "2", "--compress", "powersgd:4"], None),
    # and interleaved: each chunk's buckets, their state after the rank's optimizer state
    ("mlp-data2-pipeline2-interleaved-compress", "examples/mlp.dm", SMALL_MLP, "data=2,pipeline=2",
     ["--microbatches", "2", "--schedule", "interleaved", "--chunks", "2", "--compress", "topk:0.1"], None),
    # ... under fp16: the rank checks every chunk's compressed partials before any compresses
    ("mlp-data2-pipeline2-interleaved-compress-fp16", "examples/mlp.dm", SMALL_MLP, "data=2,pipeline=2",
     ["--microbatches", "2", "--schedule", "interleaved", "--chunks", "2", "--compress", "powersgd:2", "--precision",
      "fp16"], None),
    # parameter servers: the workers' params and grads staged to the host servers, which run
    # the C dialect's update; synchronous and asynchronous
    # (and their checkpoints: the snapshot's parameters staged into device memory)
    ("mlp-data2-ps", "examples/mlp.dm", SMALL_MLP, "data=2", ["--param-servers", "2", "--checkpoint", "ckpt-ps"], None),
    ("gpt-data2-ps-stale", "examples/gpt.dm", TINY_GPT, "data=2", ["--param-servers", "1", "--ps-staleness", "1"], None),
    ("mlp-data2-ps-stale-fp16", "examples/mlp.dm", SMALL_MLP, "data=2",
     ["--param-servers", "2", "--ps-staleness", "1", "--precision", "fp16"], None),
    # magnitude pruning: the mask applied on the device, chosen on the ramp's updates from
    # the weights staged through host memory (runtime/prune.c's rule), element by element,
    # by output channel, and on data=2 (the replicas choose alike)
    ("mlp-prune", "examples/mlp.dm", SMALL_MLP, None, ["--prune", "0.5"], None),
    ("mlp-prune-rows", "examples/mlp.dm", SMALL_MLP, None, ["--prune", "0.5:rows"], None),
    ("mlp-data2-prune", "examples/mlp.dm", SMALL_MLP, "data=2", ["--prune", "0.5"], None),
    ("gpt-prune", "examples/gpt.dm", "V=256,T=64,C=128,NH=4,L=2,B=4", None, ["--prune", "0.5"], None),
    # :rows on gpt.dm: its attentions' heads chosen together (dmrt_gpu_prune_heads)
    ("gpt-prune-heads", "examples/gpt.dm", TINY_GPT, None, ["--prune", "0.5:rows"], None),
    ("mlp-data2-mpi", "examples/mlp.dm", SMALL_MLP, "data=2", ["--backend", "mpi"], None),
    ("gpt-serial", "examples/gpt.dm", TINY_GPT, None, [], None),
    ("gpt-data2", "examples/gpt.dm", TINY_GPT, "data=2", [], None),
    ("gpt-tensor2", "examples/gpt.dm", TINY_GPT, "tensor=2", [], None),
    ("gpt-data2-tensor2", "examples/gpt.dm", TINY_GPT, "data=2,tensor=2", ["--tf32"], None),
    ("gpt-pipeline2", "examples/gpt.dm", TINY_GPT, "pipeline=2", ["--microbatches", "2", "--schedule", "1f1b"], None),
    # checkpoints: the optimizer state copied out of (and into) device memory, whole or
    # gathered from the ranks' blocks (with a GPU the step's checkpoint is written)
    ("mlp-checkpoint", "examples/mlp.dm", SMALL_MLP, None, ["--checkpoint", "ckpt-mlp"], None),
    ("mlp-data2-tensor2-checkpoint", "examples/mlp.dm", SMALL_MLP, "data=2,tensor=2", ["--checkpoint", "ckpt-mlp-dt"],
     None),
    ("gpt-pipeline2-checkpoint", "examples/gpt.dm", TINY_GPT, "pipeline=2",
     ["--microbatches", "2", "--checkpoint", "ckpt-gpt-p2"], None),
    ("gpt-124M", "examples/gpt.dm", "B=4,T=1024,V=50304", None, [], None),
]
# --quantize's three modes (runtime/cuda/quant.cu): an inference program, run with --predict
# (the weight-only modes) or calibrated and saved (int8) rather than trained; mlp.dm at
# D=784 (Fashion-MNIST's calibration rows) with an odd width (cuBLAS's int8 GEMM refuses
# some of its products), gpt.dm at widths it takes
QUANT_MLP, QUANT_GPT = "B=16,D=784,H=63,K=10", "V=256,T=64,C=128,NH=4,L=2,B=4"
CASES += [("%s-quantize-%s" % (model, mode.split(":")[0]), "examples/%s.dm" % model, sets, None, ["--quantize", mode], None)
          for model, sets in (("mlp", QUANT_MLP), ("gpt", QUANT_GPT))
          for mode in ("int8-weights", "int4-weights:32", "int8")]
# llama.dm's weights are read x @ transpose(W): narrow copies of their transposes, widened
# back into the parameter's layout (quant.cu's widen_kernel, transposed)
CASES += [("llama-quantize-%s" % mode, "examples/llama.dm", "V=256,T=16,C=32,NH=4,NKV=2,F=48,L=2,B=4", None,
           ["--quantize", mode], None) for mode in ("int8-weights", "int8")]
# --quantize-embeddings: gpt.dm's tied wte narrow too (its head product, its embedding
# reading the f32 copy, which holds the dequantized values on a separate memory's target)
CASES += [("gpt-quantize-%s-embeddings" % mode.split(":")[0], "examples/gpt.dm", QUANT_GPT, None,
           ["--quantize", mode, "--quantize-embeddings"], None) for mode in ("int4-weights:32", "int8")]


def batch_file(tmp, dm, sets):
    """One step of random inputs for the model and sizes."""
    dims = {k: int(v) for k, v in (kv.split("=") for kv in sets.split(","))}
    rng = np.random.default_rng(0)
    if "gpt" not in dm and "llama" not in dm:
        b = {"x": rng.standard_normal((1, dims["B"], dims["D"])).astype(np.float32),
             "y": rng.integers(0, dims["K"], (1, dims["B"])).astype(np.int32)}
    else:
        shape = (1, dims["B"], dims["T"])
        b = {"tokens": rng.integers(0, dims["V"], shape).astype(np.int32),
             "targets": rng.integers(0, dims["V"], shape).astype(np.int32)}
    path = os.path.join(tmp, "batch-%s.safetensors" % sets.replace(",", "_").replace("=", ""))
    stio.save(b, path)
    return path


def quantized_run(tmp, name, dm, sets, mode):
    """A --quantize program's run: int8 calibrates on data written here (a Fashion-MNIST
    directory of random pixels, or a text corpus) and saves its file; the others predict
    the batch's inputs. The trainer options and the file the run writes."""
    out = os.path.join(tmp, name + "-out.safetensors")
    if mode != "int8":
        inputs = {k: v[0] for k, v in stio.load(batch_file(tmp, dm, sets)).items() if k in ("x", "tokens")}
        path = os.path.join(tmp, name + "-inputs.safetensors")
        stio.save(inputs, path)
        return ["--predict", "--batch-file", path, "--out", out], out
    if "gpt" in dm or "llama" in dm:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "wb") as f:
            f.write(bytes(np.random.default_rng(0).integers(32, 127, 8192).astype(np.uint8)))
        return ["--data", "text:" + corpus, "--calibrate", "16", "--save-quantized", out], out
    data = os.path.join(tmp, "fmnist")
    if not os.path.isdir(data):
        os.mkdir(data)
        write_fashion_mnist(np, data, 64, 8)
    return ["--data-dir", data, "--calibrate", "32", "--save-quantized", out], out
def distill_cases(tmp):
    """dmc run --teacher: tests/ref/test_distill.py's students and teachers, both generated for
    CUDA, compiled by nvcc and linked into one program: the linear student serial and on
    data=2, the two-layer one (split over tensor) on data=2 x tensor=2 x pipeline=2 with 2
    micro-batches (each rank's teacher created beside its rank, on its device)."""
    b, d, h, k = test_distill.B, test_distill.D, test_distill.H, test_distill.K
    rng = np.random.default_rng(1)
    cases = []
    for name, text, classes, mesh, extra in [
            ("distill", test_distill.STUDENT, k, None, []),
            ("distill-data2", test_distill.STUDENT, k, "data=2", []),
            ("distill-d2t2p2", test_distill.MESH_STUDENT, 6, "data=2,tensor=2,pipeline=2", ["--microbatches", "2"])]:
        student = test_distill.write(os.path.join(tmp, "student_%s.dm" % name.replace("-", "_")), text)
        teacher = test_distill.write(os.path.join(tmp, "teacher_k%d.dm" % classes),
                                     test_distill.TEACHER % (b, d, h, classes, "cross_entropy(logits, y)"))
        weights = os.path.join(tmp, "teacher_k%d.safetensors" % classes)
        stio.save({"w1": rng.standard_normal((d, h)).astype(np.float32),
                   "w2": rng.standard_normal((h, classes)).astype(np.float32)}, weights)
        cases.append((name, student, "B=%d,D=%d,K=%d" % (b, d, classes), mesh, extra + ["--teacher", teacher, "--teacher-init", weights],
                      None))
    return cases


def attention_problem(name, dm, sets, extra, source):
    """gpt.dm's and llama.dm's attention calls cuDNN's (both directions) under 16-bit products,
    else the f32 kernel's; gpt.dm's the _inner calls (its heads' split and merge transposes
    folded into the attention), llama.dm's the _grouped calls where it has fewer kv heads
    (NKV) than heads, else the plain ones (RoPE between the split and the attention keeps
    the transposes)."""
    model = os.path.basename(dm)
    if model not in ("gpt.dm", "llama.dm") or "--quantize" in extra or "--teacher" in extra:
        return None
    with open(source) as f:
        text = f.read()
    sixteen = "--precision" in extra and extra[extra.index("--precision") + 1] in ("bf16", "fp16")
    dims = dict(kv.split("=") for kv in sets.split(","))
    grouped = "NKV" in dims and dims["NKV"] != dims.get("NH", "8")  # llama.dm's default NH
    layout = "_inner" if model == "gpt.dm" else "_grouped" if grouped else ""
    for direction in ("forward", "backward"):
        for bits in ("", "16"):
            for suffix in ("", "_grouped", "_inner"):
                call = "dmrt_gpu_attention%s_%s%s(" % (bits, direction, suffix)
                want = (bits == "16") == sixteen and suffix == layout
                if (call in text) != want:
                    return "%s: %s %s in %s" % (name, call, "missing" if want else "unexpected", source)
    return None


def bias_activation_problem(name, source):
    """gpt-serial and gpt-124M: each layer's gelu adds c_fc's bias and stores the sum itself
    (passes/fuse_bias.c; the kernel's also_ parameter), its product made with beta 0 and
    no fill kernel before it."""
    if name not in ("gpt-serial", "gpt-124M"):
        return None
    with open(source) as f:
        text = f.read()
    layers = len(re.findall(r"/\* h_\d+_mlp_c_fc = h_\d+_mlp_c_fc_matmul \+ its bias h_\d+_mlp_c_fc_bias, "
                            r"stored, and gelu of it, in one pass \*/", text))
    products = text.count("_mlp_c_fc_bias is added by ")
    if layers == 0 or layers != products or "float *also_" not in text:
        return "%s: the gelu's bias fold: %d passes, %d products, also_ %s in %s" % (
            name, layers, products, "float *also_" in text, source)
    return None


def run_case(dmc, root, tmp, case, has_gpu):
    name, dm, sets, mesh, extra, build_error = case
    keep = os.path.join(tmp, name)
    written = None
    if "--quantize" in extra:
        run_args, written = quantized_run(tmp, name, dm, sets, extra[extra.index("--quantize") + 1])
    else:
        run_args = ["--steps", "1", "--batch-file", batch_file(tmp, dm, sets)]
    cmd = [dmc, "run", os.path.join(root, dm), "--target", "cuda", "--keep", keep, "--quiet", "--set", sets] + run_args
    if mesh:
        cmd += ["--mesh", mesh]
    cmd += extra
    if "--backend" in extra and not shutil.which("mpirun"):
        print("%-18s skipped: no mpirun" % name)
        return None
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=900, env=dict(os.environ, TMPDIR=tmp, DMC_BUILD_CACHE="off"))
    out = r.stdout + r.stderr
    if build_error:
        if r.returncode == 0 or build_error not in out:
            return "%s: expected the error '%s', got exit %d:\n%s" % (name, build_error, r.returncode, out)
        print("%-18s refused as expected: %s" % (name, build_error))
        return None
    model = os.path.splitext(os.path.basename(dm))[0]
    built = [os.path.join(keep, model + ".cu"), os.path.join(keep, model)]
    if "--teacher" in extra:
        built.append(os.path.join(keep, "teacher_%s.o" % model))
    for path in built:
        if not os.path.exists(path):
            return "%s: %s was not built (exit %d):\n%s" % (name, path, r.returncode, out)
    problem = attention_problem(name, dm, sets, extra, built[0]) or bias_activation_problem(name, built[0])
    if problem:
        return problem
    if has_gpu and written:
        if r.returncode != 0 or not os.path.exists(written):
            return "%s: the quantized program failed on the GPU (exit %d):\n%s" % (name, r.returncode, out)
        print("%-18s built and ran: %s written" % (name, os.path.basename(written)))
    elif has_gpu:
        if r.returncode != 0 or "step 1 loss" not in r.stdout:
            return "%s: training a step on the GPU failed (exit %d):\n%s" % (name, r.returncode, out)
        print("%-18s built and trained: %s" % (name, [ln for ln in r.stdout.splitlines() if ln.startswith("step 1")][0]))
    else:
        if r.returncode != 1 or "no CUDA device" not in out or "Sanitizer" in out:
            return "%s: without a GPU, expected exit 1 and 'no CUDA device', got exit %d:\n%s" % (name, r.returncode, out)
        print("%-18s built; without a GPU: %s" % (name, [ln for ln in out.splitlines() if "no CUDA device" in ln][0]))
    return None


def main(argv):
    dmc, root = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    quick = len(argv) > 3 and argv[3] == "QUICK"
    r = subprocess.run([dmc, "--help"], stdout=subprocess.PIPE, universal_newlines=True)
    if "--target" not in r.stdout:
        print("FAIL: dmc --help does not list --target")
        return 1
    has_gpu = gpu_count() > 0
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-cuda-build-") as tmp:
        cases = CASES + distill_cases(tmp)
        for case in cases:
            if quick and case[0] == "gpt-124M":
                print("%-18s skipped in the sanitized build (QUICK)" % case[0])
                continue
            err = run_case(dmc, root, tmp, case, has_gpu)
            if err:
                failures.append(err)
                print("FAIL " + err.splitlines()[0])
    for f in failures:
        print("\n" + f)
    print("%d passed, %d failed" % (len(cases) - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
