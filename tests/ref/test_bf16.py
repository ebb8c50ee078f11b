#!/usr/bin/python3
"""test_bf16.py: `--precision bf16` on examples/mlp.dm against PyTorch (meson test
`ref-bf16-pytorch`).

usage: /usr/bin/python3 tests/ref/test_bf16.py DMC SOURCE_ROOT

dmc's bf16 (docs/precision.md): every matrix product rounds both operands to bf16 and
sums in f32; everything else, the master weights and AdamW's state are f32. The same
weights and batches as test_mlp.py (its torch mirror of the model), three references:

  emulation  torch f32 with each product's operands rounded to bf16, forward and backward
             (dx = bf(dy) @ bf(W)^T, dW = bf(x)^T @ bf(dy)): dmc's definition. Step-1 loss
             and every gradient, and 10 AdamW steps' losses and weights.
             Bounds: step-1 loss 2e-5 relative; gradients 1e-4 + 3e-3 |torch|; the 10
             steps' losses 3e-4, weights 2e-4 after them. Both sides round the same f32
             values, but those come out of sums in different orders, so now and then an
             operand near a bf16 rounding boundary rounds the other way: one bf16 ulp (2^-8)
             on one element, which moves a row or column of a weight's gradient, and AdamW
             then moves a weight whose gradient is near zero by up to lr. Measured: within
             2e-5 on the AVX-512 EPYC the bounds were first set on; on an AVX2 EPYC (OpenBLAS
             sums in another order) an operand of fc1's gradient flips at step 3, and the
             losses part by 7e-5 by step 10, the weights by 2.4e-5.
  f32        plain torch f32: dmc must be FAR from it (a product silently run in f32, or a
             cast dropped, lands within the emulation bounds of this one instead): the
             step-1 gradients differ from f32's by more than 10x the emulation bound's
             worst use somewhere, and the losses by > 1e-4 relative.
  autocast   torch.autocast("cpu", bfloat16): the losses of 10 AdamW steps within 1e-2
             relative (autocast also stores the product in bf16, dmc in f32: the llm.c
             tolerance for bf16 against a reference), or within twice the emulation's own
             distance from autocast where that is larger (1.3e-2 on an AVX2 EPYC, whose
             torch runs autocast's products another way).
examples/gpt.dm (test_gpt.py's tiny config, weights and batches), against the emulation in
float64 with the attention as dmc's fused attention computes it under bf16
(bf16_attention: its products' operands rounded to bf16, q, k, v, the probabilities, dout
and the scores' gradient; the softmax and its statistics f32):
  - the step-1 loss within 2e-5 (measured 3e-8; the attention's products left in f32 move
    it by 1.2e-4, plain f32 by 2.2e-4);
  - every gradient within 5e-3 of the emulation's, relative L2 distance per tensor
    (measured 1.3e-3 with oneDNN's products and the vdpbf16ps attention, 2.6e-3 with the
    other path of both: DMRT_BF16_GEMM=convert, DMC_CFLAGS=-mno-avx512bf16, as a CPU
    without AVX512-BF16 runs them). Not element-wise: the attention's backward rounds values (p, ds)
    that come out of f32 sums, and where dmc's sums and torch's part in the last bit one
    of them rounds to the neighbouring bf16 now and then; such flips spread through the
    layers below, so that the same emulation in float32 is itself 2.8e-3 from the float64
    one, element-wise bounds failing on a quarter of some tensors;
  - some gradient at least twice that bound from plain f32's and from the emulation with
    the attention's products in f32 (measured 3.6x and 2.9x, 1.7e-2 and 1.45e-2 relative):
    a product or an attention run on the f32 values would fail;
  - 10 AdamW steps' losses within 2e-3: after a few updates the bf16 rounding of weights
    that differ in their last f32 bit amplifies float noise (measured 3.6e-4, and 8.3e-4
    on the other path).
The `precision bf16` statement trains bitwise as --precision bf16, and --precision fp32
overrides it; --grad-reduce bf16 on data=2 is --compress bf16's reduction, bitwise.
The path the products took (oneDNN or converted for OpenBLAS) is run both ways with
DMRT_BF16_GEMM, and the two runs must agree within the emulation bounds. gpt's casts
folded into the loops that write their operands train bitwise as --no-fuse-casts.

Exit status: 0 pass, 1 failure, 77 torch/numpy unavailable (skip), 2 usage.
"""
import re
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
import test_mlp as mlp  # noqa: E402
from dmcrun import Failure  # noqa: E402

STEPS = 10
LOSS_RTOL = 2e-5
ADAMW_LOSS_RTOL = 3e-4
GRAD_ATOL, GRAD_RTOL = 1e-4, 3e-3
WEIGHT_ATOL = 2e-4
AUTOCAST_RTOL = 1e-2
GPT_GRAD_RTOL_L2, GPT_LOSS_RTOL = 5e-3, 2e-3


def bf16_product(torch, half=None):
    """a @ b with both operands rounded to bf16 (or the 16-bit dtype half), summed in f32,
    and the same for the two products of its backward."""
    half = half or torch.bfloat16

    def bf(t):
        return t.to(half).to(t.dtype)

    class Product(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return bf(a) @ bf(b)

        @staticmethod
        def backward(ctx, dy):
            a, b = ctx.saved_tensors
            rows_a, rows_dy = a.reshape(-1, a.shape[-1]), dy.reshape(-1, dy.shape[-1])
            return bf(dy) @ bf(b).t(), bf(rows_a).t() @ bf(rows_dy)
    return Product.apply


def bf16_attention(torch):
    """gpt_torch.forward's attention as dmc's fused kernels compute it with bf16 operands
    (runtime/dmrt_attention.h, for T <= 64: one block of keys): forward s = bf(q) bf(k)^T
    scale, m its row maximum over the visible keys, e = exp(s - m), out = bf(e) bf(v) / sum(e),
    lse = m + log(sum(e)); backward p = exp(s - lse), dv = bf(p)^T bf(dout), dp = bf(dout)
    bf(v)^T, delta = rowsum(bf(dout) out), ds = p (dp - delta) scale, dq = bf(ds) bf(k),
    dk = bf(ds)^T bf(q). A kernel whose tile products ran on the f32 values moves the step-1
    loss by about 5e-4 relative from this."""

    def bf(t):
        return t.to(torch.bfloat16).to(t.dtype)

    def scores(q, k):
        T, HS = q.shape[-2], q.shape[-1]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scale = float(torch.tensor(1.0 / HS ** 0.5, dtype=torch.float32))
        return (bf(q) @ bf(k).transpose(-1, -2) * scale).masked_fill(~causal, float("-inf")), scale

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            if q.shape[-2] > 64:
                raise Failure("bf16_attention emulates one block of keys: T <= 64")
            s, _ = scores(q, k)
            m = s.amax(dim=-1, keepdim=True)
            e = torch.exp(s - m)
            total = e.sum(dim=-1, keepdim=True)
            out = (bf(e) @ bf(v)) / total
            ctx.save_for_backward(q, k, v, out, m + torch.log(total))
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse = ctx.saved_tensors
            s, scale = scores(q, k)
            p = torch.exp(s - lse)
            dv = bf(p).transpose(-1, -2) @ bf(dout)
            dp = bf(dout) @ bf(v).transpose(-1, -2)
            delta = (bf(dout) * out).sum(dim=-1, keepdim=True)
            ds = p * (dp - delta) * scale
            return bf(ds) @ bf(k), bf(ds).transpose(-1, -2) @ bf(q), dv

    return lambda torch_, q, k, v: Attention.apply(q, k, v)


def torch_run(torch, init, xs, ys, steps, norm, mode):
    """mlp.torch_run's model with its products as `mode` says: "emulation", "f32" or
    "autocast". Returns (losses, step-1 grads, final params)."""
    import torch.nn.functional as F
    product = bf16_product(torch) if mode == "emulation" else (lambda a, b: a @ b)
    p = {n: torch.tensor(v, dtype=torch.float32, requires_grad=True) for n, v in init.items()}
    opt = torch.optim.AdamW([p[n] for n, _ in mlp.PARAMS], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    losses, grads1 = [], None
    for s in range(steps):
        x = torch.tensor(xs[s % len(xs)])
        y = torch.tensor(ys[s % len(ys)], dtype=torch.int64)
        for t in p.values():
            t.grad = None
        if norm:
            x = (x - torch.tensor(norm[0], dtype=torch.float32)) / torch.tensor(norm[1], dtype=torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            h1 = torch.relu(product(x, p["fc1.weight"]) + p["fc1.bias"])
            h2 = torch.relu(product(h1, p["fc2.weight"]) + p["fc2.bias"])
            logits = product(h2, p["fc3.weight"]) + p["fc3.bias"]
        loss = F.cross_entropy(logits.float(), y)
        loss.backward()
        losses.append(loss.item())
        if grads1 is None:
            grads1 = {n: t.grad.detach().double().numpy().copy() for n, t in p.items()}
        opt.step()
    return losses, grads1, {n: t.detach().double().numpy() for n, t in p.items()}


def run_bf16(dmc, src_path, tmp, args, path):
    env_path = os.environ.get("DMRT_BF16_GEMM")
    os.environ["DMRT_BF16_GEMM"] = path
    try:
        return mlp.run_dmc(dmc, src_path, tmp, ["--precision", "bf16"] + args)
    finally:
        if env_path is None:
            del os.environ["DMRT_BF16_GEMM"]
        else:
            os.environ["DMRT_BF16_GEMM"] = env_path


def far_from_f32(np, grads, f32_grads):
    """The largest gradient difference from plain f32 over the emulation bound's scale."""
    worst = 0.0
    for name, _ in mlp.PARAMS:
        g, w = grads[name].astype(np.float64), f32_grads[name]
        worst = max(worst, float(np.max(np.abs(g - w) / (GRAD_ATOL + GRAD_RTOL * np.abs(w)))))
    return worst


def statement_checks(dmc, src_path, tmp, common):
    """`precision bf16` in the file trains as --precision bf16 does (the same losses, bit for
    bit), and --precision fp32 on the command line wins over it."""
    with open(src_path) as f:
        src = f.read()
    marked = os.path.join(tmp, "statement", "mlp.dm")
    os.makedirs(os.path.dirname(marked))
    with open(marked, "w") as f:
        f.write(src.replace("\nmesh(", "\nprecision bf16\nmesh(", 1))
    args = common + ["--steps", "3"]
    by_flag = mlp.run_dmc(dmc, src_path, tmp, ["--precision", "bf16"] + args)
    by_statement = mlp.run_dmc(dmc, marked, tmp, args)
    f32 = mlp.run_dmc(dmc, src_path, tmp, args)
    overridden = mlp.run_dmc(dmc, marked, tmp, ["--precision", "fp32"] + args)
    print("statement: precision bf16 %s, --precision bf16 %s; with --precision fp32 %s, fp32 %s"
          % (by_statement, by_flag, overridden, f32))
    if by_statement != by_flag or overridden != f32 or by_flag == f32:
        raise Failure("the precision statement: bf16 by statement %s vs by flag %s; overridden by --precision fp32 %s "
                      "vs fp32 %s" % (by_statement, by_flag, overridden, f32))
    # --grad-reduce bf16 is --compress bf16's 16-bit allreduce, and differs from fp32's
    dp = ["--precision", "bf16", "--mesh", "data=2"] + args
    reduced = [mlp.run_dmc(dmc, src_path, tmp, dp + extra)
               for extra in (["--grad-reduce", "bf16"], ["--compress", "bf16"], ["--grad-reduce", "fp32"])]
    print("--grad-reduce bf16 %s, --compress bf16 %s, --grad-reduce fp32 %s" % tuple(reduced))
    if reduced[0] != reduced[1] or reduced[0] == reduced[2]:
        raise Failure("--grad-reduce bf16 %s should be --compress bf16 %s, unlike fp32 %s" % tuple(reduced))


def gpt_checks(dmc, root, np, torch, tmp):
    """examples/gpt.dm (test_gpt.py's tiny config and weights): the step-1 loss and every
    gradient, and 10 AdamW steps' losses, against the emulation; far from plain f32."""
    import stio
    import gpt_torch as G
    import test_gpt as tg
    specs = G.param_specs(tg.V, tg.T, tg.C, tg.L)
    init = G.make_init(torch, specs, 1234)
    tokens, targets = tg.make_batches(np, 5678, STEPS)
    init_path, batch_path = os.path.join(tmp, "gpt-init.safetensors"), os.path.join(tmp, "gpt-batches.safetensors")
    stio.save(init, init_path)
    stio.save({"tokens": tokens, "targets": targets}, batch_path)
    src = os.path.join(root, "examples", "gpt.dm")
    common = ["--set", tg.SETS, "--init", init_path, "--batch-file", batch_path, "--precision", "bf16"]
    product, attention = bf16_product(torch), bf16_attention(torch)
    grads_path = os.path.join(tmp, "gpt-grads.safetensors")
    d1 = dmcrun.run_dmc(dmc, src, tmp, common + ["--steps", "1", "--dump-grads", grads_path], timeout=240)
    # the emulation in float64: the definition's values, each rounding of the f32 one
    e1, e_grads, _ = G.train(torch, init, tokens, targets, tg.NH, tg.L, 1, torch.float64, product=product,
                             attention=attention)
    a1, a_grads, _ = G.train(torch, init, tokens, targets, tg.NH, tg.L, 1, torch.float64, product=product)
    f1, f_grads, _ = G.train(torch, init, tokens, targets, tg.NH, tg.L, 1, torch.float32)
    dmcrun.check_losses("gpt step1", d1, e1, LOSS_RTOL)
    grads = stio.load(grads_path)
    names = [n for n, _ in specs]

    def apart(n, want):
        got = grads[n].astype(np.float64)
        return float(np.linalg.norm(got - want[n]) / max(np.linalg.norm(want[n]), 1e-30))
    worst = max(names, key=lambda n: apart(n, e_grads))
    print("gpt grad     relative L2 distance from the emulation, worst %s %.3g (bound %.3g)"
          % (worst, apart(worst, e_grads), GPT_GRAD_RTOL_L2))
    if apart(worst, e_grads) > GPT_GRAD_RTOL_L2:
        raise Failure("gpt grad: '%s' is %.3g (relative L2) from the emulation's, bound %.3g"
                      % (worst, apart(worst, e_grads), GPT_GRAD_RTOL_L2))
    # a product run on the f32 values, the attention's included, moves some gradient further
    far = {what: max(apart(n, want) for n in names) / GPT_GRAD_RTOL_L2
           for what, want in (("plain f32", f_grads), ("the attention's products in f32", a_grads))}
    print("gpt          farthest gradient from plain f32 %.3g x the bound, from the attention in f32 %.3g x; "
          "step-1 loss %.3g and %.3g relative from theirs" % (far["plain f32"], far["the attention's products in f32"],
                                                               abs(d1[0] - f1[0]) / abs(f1[0]),
                                                               abs(d1[0] - a1[0]) / abs(a1[0])))
    for what, times in far.items():
        if times < 2:
            raise Failure("gpt: dmc's bf16 gradients are within %.3g bounds of %s's (was a product not rounded?)"
                          % (times, what))

    def adamw(ps):
        return torch.optim.AdamW(ps, lr=tg.LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=tg.WD)
    d = dmcrun.run_dmc(dmc, src, tmp, common + ["--steps", str(STEPS)], timeout=240)
    e, _, _ = G.train(torch, init, tokens, targets, tg.NH, tg.L, STEPS, torch.float64, adamw, product, attention)
    dmcrun.check_losses("gpt adamw", d, e, GPT_LOSS_RTOL)
    fused_cast_checks(dmc, src, tmp, common)


def fused_cast_checks(dmc, src, tmp, common):
    """The C target rounds an activation's bf16 copy in the loop that writes the activation,
    and a gradient's in the loop that sums it into a bias's gradient where that comes
    right after the cast (codegen/emit_fused_cast.c): the generated gpt.c says so for some
    casts of each kind, and training gives the same bits as with --no-fuse-casts (every
    cast a loop of its own): the losses of 10 steps and the weights saved after them."""
    def folded(extra):
        out = os.path.join(tmp, "gen" + "".join(extra))
        r = subprocess.run([dmc, "-o", out, src] + common[:2] + ["--precision", "bf16"] + extra,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        if r.returncode != 0:
            raise Failure("dmc -o %s: %s" % (out, r.stderr))
        with open(os.path.join(out, "gpt.c")) as f:
            code = f.read()
        return code, (code.count("stored by the loop that wrote"), code.count("stored by the loop that sums"))
    code, n_fused = folded([])
    n_unfused = folded(["--no-fuse-casts"])[1]
    print("gpt casts stored by their operand's loop, by its sum's: %d, %d; with --no-fuse-casts %d, %d"
          % (n_fused + n_unfused))
    if 0 in n_fused or n_unfused != (0, 0):
        raise Failure("gpt: casts folded into their operand's loop, its sum's: %d, %d (want some of each), with "
                      "--no-fuse-casts %d, %d (want none)" % (n_fused + n_unfused))
    # where nothing but the cast reads an activation (the layernorms' outputs, GELU's, the
    # weights' q, k and v windows), its loop stores the copy alone: the f32 value is never
    # stored (no "name[" assignment, no row pointer into it); the bits are checked below
    unread = re.findall(r"const float (\w+)_value = ", code)
    marked = code.count("in the same pass (nothing else reads its f32 value) */")
    norms = re.findall(r"float out_row\[\d+\]; /\* (\w+)'s row, which only its copy is made from \*/", code)
    kinds = sorted(set(re.sub(r"^h_\d+_", "h_L_", name) for name in unread + norms))
    print("gpt activations whose f32 values are not stored: %d loops, %d layernorms (%s)"
          % (len(unread), len(norms), ", ".join(kinds)))
    stored = [name for name in unread + norms if re.search(r"\b%s\[[^\]]*\] = |\b%s \+ base;" % (name, name), code)]
    if not unread or not norms or "h_L_mlp_gelu" not in kinds or stored or marked != len(unread) + len(norms):
        raise Failure("gpt: want GELU's loops and the layernorms to store only the bf16 copies of values nothing "
                      "else reads; loops %d, layernorms %d (%d said so), f32 stores left: %s"
                      % (len(unread), len(norms), marked, stored))
    runs = []
    for extra in ([], ["--no-fuse-casts"]):
        saved = os.path.join(tmp, "gpt-final%s.safetensors" % "".join(extra))
        losses = dmcrun.run_dmc(dmc, src, tmp, common + ["--steps", str(STEPS), "--save", saved] + extra, timeout=240)
        with open(saved, "rb") as f:
            runs.append((losses, f.read()))
    print("gpt folded casts: %d losses %s, weights %s to --no-fuse-casts'"
          % (STEPS, "equal" if runs[0][0] == runs[1][0] else "DIFFERENT", "bitwise equal" if runs[0][1] == runs[1][1] else "DIFFERENT"))
    if runs[0] != runs[1]:
        raise Failure("gpt: training with casts folded into their operand's loops differs from --no-fuse-casts")


def weight_cast_checks(dmc, src_path):
    """One micro-batch: the backward's products read the forward's 16-bit copy of each weight
    (one cast of each); with micro-batches (--accumulate 2) the backward casts a weight again
    rather than keep a copy per micro-batch (passes/precision.c). Counted in --emit=ir: the
    weights the backward's products read, fc2 and fc3 (fc1's input gradient is not computed)."""
    def casts(extra):
        r = subprocess.run([dmc, "--emit=ir", "--precision", "bf16", src_path] + extra, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        if r.returncode != 0:
            raise Failure("dmc --emit=ir --precision bf16 %s: %s" % (" ".join(extra), r.stderr))
        counts = {}
        for line in r.stdout.splitlines():
            if "= cast" in line and ".weight.bf16" in line:
                name = line.split()[1]
                counts[name] = counts.get(name, 0) + 1
        return counts
    want_one = {"fc1.weight.bf16": 1, "fc2.weight.bf16": 1, "fc3.weight.bf16": 1}
    want_two = {"fc1.weight.bf16": 1, "fc2.weight.bf16": 2, "fc3.weight.bf16": 2}
    one, two = casts([]), casts(["--accumulate", "2"])
    print("weight casts: one micro-batch %s, --accumulate 2 %s" % (one, two))
    if one != want_one or two != want_two:
        raise Failure("weight casts: one micro-batch %s (want %s), --accumulate 2 %s (want %s)"
                      % (one, want_one, two, want_two))


def run_checks(dmc, root, np, torch):
    import stio
    src_path, _, norm = mlp.example(root, "test_bf16.py")
    paths = ["convert"]
    if "avx512_bf16" in open("/proc/cpuinfo").read():
        paths.insert(0, "onednn")
    else:
        print("this CPU has no AVX512-BF16: only the convert path runs")
    with tempfile.TemporaryDirectory(prefix="dmc-ref-bf16-") as tmp:
        init, xs, ys, common = mlp.write_data(np, torch, tmp)
        e_losses, e_grads, e_final = torch_run(torch, init, xs, ys, STEPS, norm, "emulation")
        f_losses, f_grads, _ = torch_run(torch, init, xs, ys, 1, norm, "f32")
        a_losses, _, _ = torch_run(torch, init, xs, ys, STEPS, norm, "autocast")
        emulation_off = max(abs(e - a) / abs(a) for e, a in zip(e_losses, a_losses))
        autocast_rtol = max(AUTOCAST_RTOL, 2 * emulation_off)
        print("the emulation's losses are %.3g from autocast's: dmc's bound against autocast %g"
              % (emulation_off, autocast_rtol))
        for path in paths:
            grads_path = os.path.join(tmp, "grads-%s.safetensors" % path)
            d1 = run_bf16(dmc, src_path, tmp, common + ["--steps", "1", "--dump-grads", grads_path], path)
            mlp.check_losses("%s step1" % path, d1, e_losses[:1])
            grads = stio.load(grads_path)
            mlp.check_tensors(np, "%s grad" % path, grads, e_grads, GRAD_ATOL, GRAD_RTOL)
            far = far_from_f32(np, grads, f_grads)
            loss_far = abs(d1[0] - f_losses[0]) / abs(f_losses[0])
            print("%-8s distance from plain f32: gradients %.3g x the emulation bound, step-1 loss %.3g relative"
                  % (path, far, loss_far))
            if far < 10 or loss_far < 1e-4:
                raise Failure("%s: dmc's bf16 run is as close to plain f32 as to the bf16 emulation (gradients %.3g x "
                              "bound, loss %.3g): a product ran on f32 operands" % (path, far, loss_far))
            out = os.path.join(tmp, "final-%s.safetensors" % path)
            d = run_bf16(dmc, src_path, tmp, common + ["--steps", str(STEPS), "--save", out], path)
            dmcrun.check_losses("%s adamw" % path, d, e_losses, ADAMW_LOSS_RTOL)
            mlp.check_tensors(np, "%s adamw" % path, stio.load(out), e_final, WEIGHT_ATOL, 0.0)
            dmcrun.check_losses("%s autocast" % path, d, a_losses, autocast_rtol)
        statement_checks(dmc, src_path, tmp, common)
        weight_cast_checks(dmc, src_path)
        gpt_checks(dmc, root, np, torch, tmp)
    return ("examples/mlp.dm --precision bf16 matches PyTorch's bf16 products (%s): step-1 gradients, %d AdamW "
            "steps, and autocast's losses within %g; examples/gpt.dm's step-1 gradients and %d AdamW steps"
            % (", ".join(paths), STEPS, AUTOCAST_RTOL, STEPS))


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
