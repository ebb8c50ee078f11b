#!/usr/bin/env python3
"""gpu_gpt2.py: GPT-2 124M training steps on one GPU, dmc's CUDA target vs PyTorch eager.

usage: python3 bench/gpu_gpt2.py --dmc BUILD/driver/dmc [--batches 8,16] [--precisions fp32,tf32,bf16,fp16]
           [--steps N] [--profile [PRECISIONS]] [--compare-cublaslt]

Run it with an interpreter whose torch has CUDA (the GPU machine's python3); the dmc
build must have found the CUDA toolkit (libdmrt_cuda).

Model:   examples/gpt.dm at its defaults (V=50304, T=1024, C=768, NH=12, L=12), B from
         --batches.
Data:    random tokens (numpy, seed 0) written once per B to a batch file; both sides train
         on the same slices in the same order, from dmc's own initial weights (`--steps 0
         --save W`), with AdamW(lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01) as
         gpt.dm declares it.
dmc:     `dmc run examples/gpt.dm --target cuda [--tf32] --set B=.. --init W --batch-file F
         --steps N --quiet`; step time from the trainer's `step n loss x ms y` lines
         (train_step, host to host, the loss copied back each step).
PyTorch: bench/gpt_step.py's TorchGPT on the GPU (the same parameters, weights [in, out],
         addmm), with F.scaled_dot_product_attention(is_causal=True); a step is timed from
         zero_grad to the end of opt.step() with torch.cuda.synchronize() on both sides.
         fp32: allow_tf32 False for matmuls and cuDNN; tf32: True (dmc: --tf32); bf16 and
         fp16: torch.autocast(dtype) around the forward and loss (fp16 with a GradScaler at
         its defaults), dmc --precision bf16|fp16 (fp32 master weights on both sides).
Per run: WARMUP steps, then the median of N measured steps.
Memory:  peak GPU memory in use (nvidia-smi's memory.used of GPU 0, polled every 50 ms)
         above what was in use before: dmc's process with its CUDA context, PyTorch's
         memory pool without its context (made earlier in this process); and PyTorch's own
         max_memory_allocated.
MFU:     model flops per token 6 N + 12 L C T (nanoGPT's estimate_mfu, N the parameters),
         times tokens/s, over the device's dense peak at that precision (H100/H200 SXM:
         fp32 67, tf32 494.7, bf16 and fp16 989.4 TFLOP/s; override with --peak-tflops).
Check:   PyTorch's losses from dmc's weights on the same batches follow dmc's (max relative
         difference printed; fails above 1e-3 in fp32, 2e-2 in tf32, 5e-2 in bf16 and fp16:
         16-bit operands round differently on each side, as llm.c's bf16 check allows).
--compare-cublaslt: runs each dmc program again with DMRT_CUBLASLT=off (biases added and
         summed by the runtime's own kernels, docs/gpu.md "Matrix products") and prints both
         step times: whether cuBLASLt's epilogues pay.
--profile: runs two of dmc's steps under `nsys profile --stats=true`, or where nsys is not
         installed under Nsight Compute (`ncu --metrics gpu__time_duration.sum`, kernels
         serialised), and prints the top kernels by GPU time per step; for each precision,
         or for those listed (--profile bf16).
Prints a line as each (B, precision) is measured, then a table: ms/step, tokens/s, MFU and
peak memory of each, and torch ms / dmc ms. A loss check that fails is said on its row and
in the exit status (1), after the other rows are measured.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "ref"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

DIMS = {"V": 50304, "T": 1024, "C": 768, "NH": 12, "L": 12}
WARMUP = 3
PEAK_TFLOPS = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}   # H100 SXM dense (H200: the same)
LOSS_RTOL = {"fp32": 1e-3, "tf32": 2e-2, "bf16": 5e-2, "fp16": 5e-2}


class PeakMemory:
    """Polls nvidia-smi for the largest memory.used of GPU 0 above what was in use when it
    started (MiB): per-process figures are not available in every container, and one
    process at a time uses the GPU here."""

    def __init__(self):
        self.peak, self.stop = 0, threading.Event()
        self.base = self.used()
        self.thread = threading.Thread(target=self.poll, daemon=True)

    @staticmethod
    def used():
        try:
            out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                                 timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return 0
        return int(out) if out.isdigit() else 0

    def poll(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.used() - self.base)
            time.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def dmc_run(cmd, tmp, measure=False, env=None):
    """Runs dmc (or a program it built) with env's variables added; returns (stdout, stderr, peak MiB)."""
    proc = subprocess.Popen(cmd, cwd=tmp, env=dict(os.environ, TMPDIR=tmp, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    if measure:
        with PeakMemory() as mem:
            out, err = proc.communicate()
        peak = mem.peak
    else:
        out, err = proc.communicate()
        peak = 0
    if proc.returncode != 0:
        raise DmcFailed("gpu_gpt2: `%s` failed (%d):\n%s" % (" ".join(cmd), proc.returncode, err[-3000:]))
    return out, err, peak


class DmcFailed(Exception):
    """dmc, or a program it built, exited non-zero: that precision's row is lost, not the run."""


def torch_steps(torch, stio, TorchGPT, dims, init, batches, steps, prec):
    """PyTorch eager's steps at precision prec: (median ms, losses, max allocated MiB, peak MiB)."""
    tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec)
    scaler = torch.cuda.amp.GradScaler() if prec == "fp16" else None
    model = TorchGPT(torch, dims, stio.load(init), True)
    model.p = {n: torch.nn.Parameter(t.detach().cuda()) for n, t in model.p.items()}
    model.mask = model.mask.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    data = stio.load(batches)
    S = data["tokens"].shape[0]
    tokens = [torch.from_numpy(data["tokens"][s].astype("int64")).cuda() for s in range(S)]
    targets = [torch.from_numpy(data["targets"][s].astype("int64")).cuda() for s in range(S)]
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    poll = PeakMemory()
    poll.base -= torch.cuda.memory_reserved() // 2**20   # what this process held already counts
    poll.__enter__()
    for i in range(WARMUP + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=half, enabled=half is not None):
            loss = model.loss(tokens[i % S], targets[i % S])
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    poll.__exit__()
    allocated = torch.cuda.max_memory_allocated() / 2**20
    del model, opt, tokens, targets
    torch.cuda.empty_cache()
    return 1e3 * statistics.median(times[WARMUP:]), losses, allocated, poll.peak


NCU_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}


def profile_dmc_ncu(ncu, cmd, tmp, steps):
    """Per-kernel GPU time of dmc's steps from Nsight Compute (one metric, no clock lock):
    kernels serialised, so the sum is the GPU busy time without overlap."""
    r = subprocess.run([ncu, "--csv", "--clock-control", "none", "--metrics", "gpu__time_duration.sum"] + cmd,
                       cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    import csv
    rows = [row for row in csv.reader(line for line in r.stdout.splitlines() if line.startswith('"'))]
    if not rows or "Kernel Name" not in rows[0]:
        print("profile: ncu gave no table (exit %d):\n%s" % (r.returncode, r.stdout[-2000:]))
        return
    col = {name: i for i, name in enumerate(rows[0])}
    by_kernel = {}
    for row in rows[1:]:
        if len(row) < len(col) or row[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        ms = float(row[col["Metric Value"]].replace(",", "")) * NCU_UNITS.get(row[col["Metric Unit"]], 1e-6)
        name = row[col["Kernel Name"]].split("(")[0][:70]
        total, count = by_kernel.get(name, (0.0, 0))
        by_kernel[name] = (total + ms, count + 1)
    busy = sum(t for t, _ in by_kernel.values())
    print("profile (ncu, %d dmc steps, kernels serialised): GPU busy %.1f ms/step; top kernels" % (steps, busy / steps))
    print("%8s %6s %7s  %s" % ("ms/step", "%", "calls", "kernel"))
    for name, (t, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:25]:
        print("%8.2f %5.1f%% %7d  %s" % (t / steps, 100 * t / busy, n // steps, name))


def profile_dmc(args, cmd, tmp, steps):
    nsys = shutil.which("nsys")
    if not nsys:
        ncu = shutil.which("ncu")
        if ncu:
            return profile_dmc_ncu(ncu, cmd, tmp, steps)
        print("profile: neither nsys nor ncu is installed here; no per-kernel table")
        return
    out = os.path.join(tmp, "profile")
    r = subprocess.run([nsys, "profile", "--stats=true", "-o", out, "--force-overwrite", "true"] + cmd, cwd=tmp,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    text = r.stdout
    start = text.find("cuda_gpu_kern_sum")
    print("profile (nsys, dmc's steps): top kernels by GPU time")
    print("\n".join(text[start:].splitlines()[:30]) if start >= 0 else text[-3000:])


def main():
    ap = argparse.ArgumentParser(description="GPT-2 124M on one GPU: dmc --target cuda vs PyTorch eager")
    ap.add_argument("--dmc", required=True)
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--precisions", default="fp32,tf32")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=0, help="the device's dense peak at the precision")
    ap.add_argument("--profile", nargs="?", const="all", default="",
                    help="profile dmc's steps: every precision, or those listed (comma-separated)")
    ap.add_argument("--compare-cublaslt", action="store_true",
                    help="also run each dmc program with DMRT_CUBLASLT=off (the runtime's bias kernels)")
    args = ap.parse_args()
    args.dmc = os.path.abspath(args.dmc)
    try:
        import numpy as np
        import torch
        import stio
        from gpt_step import TorchGPT
    except ImportError as e:
        sys.exit("gpu_gpt2: needs torch with CUDA and numpy (%s)" % e)
    if not torch.cuda.is_available():
        sys.exit("gpu_gpt2: torch sees no CUDA device")
    device = torch.cuda.get_device_name(0)
    model = os.path.join(ROOT, "examples", "gpt.dm")
    print("gpu_gpt2: %s, torch %s, GPT-2 %s, median of %d steps after %d warm-up"
          % (device, torch.__version__, ",".join("%s=%d" % kv for kv in DIMS.items()), args.steps, WARMUP))
    rows, failed, profiles = [], [], []
    with tempfile.TemporaryDirectory(prefix="gpu-gpt2-") as tmp:
        for B in [int(b) for b in args.batches.split(",")]:
            dims = dict(DIMS, B=B)
            sets = ",".join("%s=%d" % kv for kv in dims.items())
            S = WARMUP + args.steps
            seq = np.random.default_rng(0).integers(0, dims["V"], size=(S, B, dims["T"] + 1)).astype(np.int32)
            batches = os.path.join(tmp, "batches-%d.safetensors" % B)
            stio.save({"tokens": seq[:, :, :-1].copy(), "targets": seq[:, :, 1:].copy()}, batches)
            init = os.path.join(tmp, "init-%d.safetensors" % B)
            _, err, _ = dmc_run([args.dmc, "run", model, "--target", "cuda", "--set", sets, "--batch-file", batches,
                                 "--steps", "0", "--save", init], tmp)
            m = re.search(r"(\d+) parameters", err)
            nparams = int(m.group(1)) if m else 0
            for prec in args.precisions.split(","):
                if prec not in PEAK_TFLOPS:
                    sys.exit("gpu_gpt2: unknown precision '%s' (fp32, tf32, bf16, fp16)" % prec)
                keep = os.path.join(tmp, "build-%d-%s" % (B, prec))
                cmd = [args.dmc, "run", model, "--target", "cuda", "--set", sets, "--batch-file", batches, "--init",
                       init, "--steps", str(S), "--quiet", "--keep", keep, "--precision", prec]
                cmd += ["--tf32"] if prec == "tf32" else []   # --precision tf32 alone is refused: it names the kernels
                try:
                    out, err, dmc_mib = dmc_run(cmd, tmp, measure=True)
                except DmcFailed as e:
                    print("%s\ngpu_gpt2: FAIL B=%d %s: dmc failed (above)" % (e, B, prec), flush=True)
                    failed.append("B=%d %s" % (B, prec))
                    continue
                # attention cuDNN did not run ran the f32 kernel (runtime/cuda/attention16.cu): say so
                fallbacks = [l for l in err.splitlines() if "the f32 attention kernel instead" in l]
                for line in fallbacks:
                    print("gpu_gpt2: B=%d %s: %s" % (B, prec, line))
                for line in err.splitlines():
                    if line.startswith("dmrt: cuBLASLt"):
                        print("gpu_gpt2: B=%d %s: %s" % (B, prec, line))
                steps = re.findall(r"^step (\d+) loss (\S+) ms ([0-9.]+)", out, re.M)
                dmc_ms = statistics.median(float(s[2]) for s in steps[WARMUP:])
                dmc_losses = [float(s[1]) for s in steps]
                if args.compare_cublaslt:
                    # the same program, its biases through the runtime's own kernels
                    try:
                        off, _, _ = dmc_run([os.path.join(keep, "gpt"), "--init", init, "--batch-file", batches,
                                             "--steps", str(S), "--quiet"], tmp, env={"DMRT_CUBLASLT": "off"})
                        off_steps = re.findall(r"^step (\d+) loss (\S+) ms ([0-9.]+)", off, re.M)
                        off_ms = statistics.median(float(s[2]) for s in off_steps[WARMUP:])
                        print("gpu_gpt2: B=%d %s: %.1f ms/step with cuBLASLt's bias epilogues, %.1f with "
                              "DMRT_CUBLASLT=off (%.2fx)" % (B, prec, dmc_ms, off_ms, off_ms / dmc_ms))
                    except DmcFailed as e:
                        print("%s\ngpu_gpt2: FAIL B=%d %s with DMRT_CUBLASLT=off (above)" % (e, B, prec), flush=True)
                        failed.append("B=%d %s DMRT_CUBLASLT=off" % (B, prec))
                t_ms, t_losses, t_alloc, t_mib = torch_steps(torch, stio, TorchGPT, dims, init, batches, args.steps, prec)
                diff = max(abs(a - b) / abs(b) for a, b in zip(t_losses, dmc_losses))
                diff = float("inf") if diff != diff else diff  # a NaN loss fails the check
                print("gpu_gpt2: B=%d %s: dmc %.1f ms/step, torch %.1f (%.2fx), losses within %.1e of each other"
                      % (B, prec, dmc_ms, t_ms, t_ms / dmc_ms, diff), flush=True)
                if not diff <= LOSS_RTOL[prec]:
                    print("gpu_gpt2: FAIL B=%d %s: PyTorch losses %s differ from dmc's %s (max rel %.2g > %.0e)"
                          % (B, prec, t_losses, dmc_losses, diff, LOSS_RTOL[prec]), flush=True)
                    failed.append("B=%d %s" % (B, prec))
                tokens = B * dims["T"]
                flops = (6 * nparams + 12 * dims["L"] * dims["C"] * dims["T"]) * tokens
                peak = (args.peak_tflops or PEAK_TFLOPS[prec]) * 1e12
                rows.append((B, prec + ("*" if fallbacks else ""), dmc_ms, t_ms, tokens, flops, peak, dmc_mib, t_mib,
                             t_alloc, diff))
                if args.profile and (args.profile == "all" or prec in args.profile.split(",")):
                    profiles.append([os.path.join(keep, "gpt"), "--init", init, "--batch-file", batches, "--steps",
                                     "2", "--quiet"])
    # after every precision's row: a profile (ncu serialises each kernel) takes long, and a
    # row not measured is worth more than a table
    for cmd in profiles:
        profile_dmc(args, cmd, tmp, 2)
    hdr = "%3s %5s %9s %9s %7s %10s %10s %6s %6s %9s %9s %9s %8s" % (
        "B", "prec", "dmc ms", "torch ms", "ratio", "dmc tok/s", "torch tok", "dmc", "torch", "dmc MiB", "torch MiB",
        "torch alc", "loss dif")
    print(hdr)
    print("-" * len(hdr))
    for B, prec, dm, tm, tokens, flops, peak, dmib, tmib, talloc, diff in rows:
        print("%3d %5s %9.1f %9.1f %6.2fx %10.0f %10.0f %5.1f%% %5.1f%% %9d %9d %9.0f %8.1e" % (
            B, prec, dm, tm, tm / dm, tokens / dm * 1e3, tokens / tm * 1e3, 100 * flops / (dm / 1e3) / peak,
            100 * flops / (tm / 1e3) / peak, dmib, tmib, talloc, diff))
    print("ratio = torch ms / dmc ms (> 1: dmc is faster); MFU columns: model flops / step time / dense peak; "
          "dmc MiB, torch MiB: peak GPU memory in use (nvidia-smi) above what was in use before (dmc: its CUDA "
          "context included; torch: its memory pool, the context not); torch alc: max_memory_allocated")
    if any(r[1].endswith("*") for r in rows):
        print("*: cuDNN did not run some attention shape, which ran dmc's f32 attention kernel (above)")
    if failed:
        print("gpu_gpt2: failed (above): %s" % ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
