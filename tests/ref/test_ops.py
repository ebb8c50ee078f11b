#!/usr/bin/python3
"""test_ops.py: PyTorch oracle for every op's shape and gradient rule (meson test
`ref-ops-pytorch`).

usage: /usr/bin/python3 tests/ref/test_ops.py DMC SOURCE_ROOT

Each small model in tests/ref/ops/ exercises a family of ops; MODELS below mirrors it
by hand in float32 torch (a second, independent statement of every shape and gradient
rule):

  elementwise.dm  gelu (tanh approximation), tanh, sigmoid, exp, log, relu, identity,
                  neg, silu, rsqrt (of a tensor, a scalar and a constant), unary minus;
                  + - * / with numbers and dims on either side
  broadcast.dm    [B, H] with [H], [B, 1] (via reshape), [1, H] and scalar parameters,
                  parameters on both sides of an op, division by a parameter
  reduce.dm       sum / mean of a rank-3 tensor over all dims, a named dim, an index
                  (-1, -2, 0), two dims (adjacent and not)
  keepdim.dm      sum / mean with keepdim = true: RMSNorm in a block (rsqrt of the mean
                  square over the last dim), a middle dim, two non-adjacent dims and all
                  dims kept; keepdim = false
  layout.dm       reshape (with -1), transpose (2-D default, last two, named and
                  indexed dims), matmul with rank-3 and rank-4 left operands
  layers.dm       a parameter used several times, a layer called twice, a repeat layer
                  of nested blocks, a block reading a top-level parameter
  xent.dm         cross_entropy over [B, T, V] logits with [B, T] targets
  transformer.dm  embed, layernorm (eps given), slice (last and middle dims, negative
                  bounds), heads split/merged, batched matmul with transpose folded
                  into it, causal_mask fused into a scaled softmax and on its own,
                  a named scaled score under the mask read again (the fusion once
                  dropped it, and its name read the softmax), softmax over the last
                  and a middle dim, sqrt, a head tied to the embedding table
  windows.dm      gradients of parameters read in slices: windows tiling a dim (rows
                  written by products, strided windows of a [C, 3, C] weight and their
                  bias rows by reductions, unequal windows copied in), overlapping
                  windows, a row no slice reads
  rope.dm         LLaMA's rotary embedding: permute (by name, by index, a 3-cycle),
                  concat (one parameter twice, rotate_half's concat(-x2, x1, dim = -1),
                  three pieces along a named middle dim, a single tensor), sin and cos
                  (of a parameter's table, of activations, of constants), arange (one,
                  two and three bounds) making RoPE's table from constants
  repeat_kv.dm    a tensor repeated along a new dim by broadcasting against a zero table,
                  and by expand, and merged into the heads (grouped-query attention's
                  repeat_kv), vs torch.repeat_interleave and torch.expand: the gradient
                  summed over the repeats; expand of a [1, C] row to [B, T, C]
  slice_views.dm  windows of parameters read in place (passes/slice_views.c): columns
                  read by products plain, transposed and as both operands; a vector's
                  and a stack's contiguous windows; a strided window read by tanh and an
                  activation's window, copied
  unreached.dm    parameters the loss does not reach (a spare vector, a layer never
                  called, a branch outside the loss) under AdamW with weight decay:
                  torch.optim skips a parameter whose .grad is None, so they must come
                  out of the steps bit for bit as they went in

Every model but unreached.dm is trained with plain SGD (lr 0.1) for 3 steps by one `dmc run` (--init:
random parameters from a fixed seed, positive where they divide; --batch-file: 3
different batches), and the test compares

  losses:   each of the 3 printed losses, |dmc - torch| <= 1e-5 * |torch|
  grads:    every gradient of step 1 (--dump-grads), |dmc - torch| <= 1e-5 + 1e-4 * |torch|
  weights:  every parameter after 3 steps (--save), |dmc - torch| <= 1e-5

element-wise. Every loss is non-linear in its terms (squares, tanh, products of
branches) so that no gradient is a constant or zero, and the parameters have random
non-zero values (biases included), so a dropped term or a wrong transpose shows.
Justification of the bounds: both sides compute in float32 with different summation
orders and libm, a few ulps (2^-24 ~ 6e-8 relative) per value amplified by the short
sums here (at most ~60 terms); the test prints the torch float32 vs float64 distance
beside each error as the scale of that noise. A wrong rule (a missing 1/n of a mean,
a wrong broadcast reduction, a transposed gradient) is off by >= 1e-3; even exact erf
gelu instead of the tanh approximation fails the loss and gradient bounds.
Measured (these seeds and dims): loss errors <= 4.3e-7 relative, gradient errors
<= 2.9e-6 absolute on gradients up to 12 (worst error/bound 0.02), weight errors
<= 3e-7 absolute; torch float32 vs float64 differs by as much.

Exit status: 0 pass, 1 failure (message on stderr), 77 torch/numpy unavailable (skip),
2 usage.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
from dmcrun import Failure  # noqa: E402

STEPS = 3
LR = 0.1
LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
WEIGHT_ATOL = 1e-5



# ---------------------------------------------------------------------------------------
# The models, mirrored in torch. Each entry: the .dm file, its inputs {name: (shape,
# kind)}, its parameters [(name, shape, kind)] with kind 'normal' (N(0, 1) times an
# optional scale) or 'positive' (uniform [0.5, 1.5)), and the loss as a function of
# (torch, F, params, inputs). Dims are the files' defaults.

def elementwise_loss(torch, F, p, i):
    B, H = 4, 6
    x, a, b, c = i["x"], p["a"], p["b"], p["c"]
    u = x * a + b
    g1 = F.gelu(u, approximate="tanh")
    t1 = torch.tanh(0.5 * u)
    s1 = torch.sigmoid(u - 1)
    e1 = torch.exp(u / 4)
    l1 = torch.log(torch.sigmoid(c) + 0.5)
    l2 = torch.log(torch.exp(c * 0.3))
    r1 = torch.relu(u)
    i1 = c
    n1 = torch.neg(c)
    m1 = -u
    k1 = 2 / (1 + e1)
    w1 = F.silu(u)
    q1 = torch.rsqrt(c * c + 0.5)
    z = g1 * c + t1 * 2 - s1 / H + e1 * l1 + r1 * i1 - n1 * m1 + H * l2 + (3 - u) / B - B + w1 * q1
    return ((z * z).mean() / 10 + k1.sum() / (B * H) + (F.silu(c) * 0.5).mean()
            + torch.rsqrt((w1 * w1).sum() + 1))


def broadcast_loss(torch, F, p, i):
    B = 5
    x = i["x"]
    w, col, s, d, row, m = p["w"], p["col"], p["s"], p["d"], p["row"], p["m"]
    c2 = col.reshape(B, 1)
    y1 = x * w + c2
    y2 = (y1 - s) / d
    y3 = w * c2
    y4 = row - c2
    y5 = m / (s * d + c2 * c2)
    y6 = s * m + row / s
    z = torch.tanh(y2) * y3 + torch.sigmoid(y4) * y5 + y6 * x
    return (z * z).mean() + s * s / 4


def reduce_loss(torch, F, p, i):
    x, w, v = i["x"], p["w"], p["v"]
    h = torch.tanh(x * w + v)                   # [B, T, C]
    s_all = h.sum()
    m_all = (h * h).mean()
    s_c = h.sum(2)
    m_t = h.mean(1)
    s_last = torch.exp(h).sum(-1)
    s_bt = h.sum((0, 1))
    m_bc = (h * x).mean((0, 2))
    m_0 = h.mean(0)
    s_m2 = h.sum(-2)
    return (s_all / 10 + m_all + (s_c * s_last).mean() / 10 + (m_t * m_t).mean()
            + (s_bt * v).sum() / 10 + torch.tanh(m_bc).sum() + (m_0 * w).mean()
            + (s_m2 * m_t).mean())


def keepdim_loss(torch, F, p, i):
    x, v, w = i["x"], p["v"], p["norm.weight"]
    h = x @ v
    n = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-5) * w
    s_t = h.sum(1, keepdim=True)
    m_bc = h.mean((0, 2), keepdim=True)
    s_all = (h * h).sum((0, 1, 2), keepdim=True)
    m_flat = h.mean(-1)
    z = n * F.silu(n) + s_t * m_bc / s_all + torch.tanh(h - h.mean(2, keepdim=True))
    return (z * z).mean() + (m_flat * m_flat).mean()


def layout_loss(torch, F, p, i):
    B, T, NH, C = 2, 3, 2, 4
    x, wq, pp, wo, g = i["x"], p["wq"], p["p"], p["wo"], p["g"]
    h = x @ wq
    q = h.reshape(B, T, NH, C // NH)
    qt = q.transpose(1, 2)                      # transpose(q, T, NH)
    o = F.gelu(qt @ wo, approximate="tanh")
    flat = o.reshape(B * NH, -1)
    y1 = flat * g
    pt = pp.t()
    x2 = x + pt
    y2 = x2.transpose(0, 2)                     # transpose(x2, B, C): [C, T, B]
    y3 = torch.tanh(y2).transpose(-2, -1)       # [C, B, T]
    y4 = y3.transpose(0, -1) @ wq               # [T, B, C]
    return (y1 * y1).mean() + (y4 * y4).mean() + y1.reshape(-1).sum() / 50


def layers_loss(torch, F, p, i):
    x, w, gate = i["x"], p["w"], p["gate"]

    def lin(name, v):
        return v @ p[name + ".weight"] + p[name + ".bias"]

    h1 = lin("shared", x)
    h2 = lin("shared", torch.tanh(h1))
    h = h2 @ w + torch.tanh(h1 @ w) * w.sum(0)
    for k in range(3):
        pre = "stack.%d." % k
        h = h + lin(pre + "proj", F.gelu(lin(pre + "fc", h), approximate="tanh")) * gate
    return (h * h).mean() + (w * w).mean()


def xent_loss(torch, F, p, i):
    V = 7
    x, y = i["x"], i["y"]
    logits = (x * p["ln"]) @ p["wte"] + p["b"]
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)) + 0.01 * (logits * logits).mean()


def transformer_loss(torch, F, p, i):
    B, T, C, V, NH = 2, 5, 6, 7, 2
    hs = C // NH
    ids = i["ids"]
    e = p["table"][ids]
    n = F.layer_norm(e, (C,), p["lnw"], p["lnb"], eps=1e-3)
    q, k, v = (t.reshape(B, T, NH, hs).transpose(1, 2) for t in (n @ p["wqkv"]).split(C, dim=-1))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    # dmc folds sqrt(C / NH) to a float32 constant: round it the same way
    scale = torch.tensor(hs ** 0.5, dtype=torch.float32).to(q.dtype)
    att = torch.softmax((q @ k.transpose(-1, -2) / scale).masked_fill(~causal, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    att2 = torch.softmax((q @ v.transpose(-1, -2)).masked_fill(~causal, float("-inf")) * 0.5, dim=-1)
    sc = q @ k.transpose(-1, -2) / 2
    att3 = torch.softmax(sc.masked_fill(~causal, float("-inf")), dim=-1)
    s2 = torch.softmax(y * p["w2"], dim=1)
    m = e[:, 1:-1, :]
    logits = (y + s2) @ p["table"].t()
    return (F.cross_entropy(logits.reshape(-1, V), ids.reshape(-1)) + (m * m).mean() + torch.sqrt(s2 + 1).mean()
            + (att2 * att2).mean() + (att3 * att3).mean() + (sc * sc).mean())


def windows_loss(torch, F, p, i):
    C = 4
    x, wr, wf, bf, wo, wn, wc = i["x"], p["wr"], p["wf"], p["bf"], p["wo"], p["wn"], p["wc"]
    r1, r2 = x @ wr[:C], x @ wr[C:]
    f0, f1, f2 = (x @ wf[:, k, :] + bf[k] for k in range(3))
    o1, o2 = wo[0:3], wo[1:4]
    n1, n2 = wn[0:1], wn[2:3]
    c1, c2 = torch.tanh(wc[0:1]), torch.tanh(wc[1:3])
    return ((torch.tanh(r1) * r2).mean() + (torch.tanh(f0) * f1 + f2 * f2).mean() + (o1 * o2 * o1).mean()
            + (n1 * n2 * n1).sum() + (c2 * c1 * c1).mean())


def slice_views_loss(torch, F, p, i):
    C = 4
    x, ws, wa, we, wm, bv = i["x"], p["ws"], p["wa"], p["we"], p["wm"], p["bv"]
    s1 = x @ ws[:, :C]
    s2 = x @ ws[:, C:].t()
    m = wa[:, C:2 * C] @ wa[:, 2 * C:]
    s3 = x @ m + bv[:C]
    e = torch.tanh(we[:, 1:C + 1])
    s4 = x @ wm[1] + bv[C:]
    h = torch.tanh(s1 * s2)
    first = h[0:1]
    return (h * s3).mean() + ((x @ e) * s4).mean() + (first * first).mean()


def unreached_loss(torch, F, p, i):
    h = i["x"] @ p["fc.weight"] + p["fc.bias"]
    _branch = i["x"] * p["side"]  # computed, not in the loss: side gets no gradient
    return (torch.tanh(h) * torch.tanh(h)).mean()


def rope_loss(torch, F, p, i):
    B, T, NH, HD, C = 2, 3, 2, 4, 8
    x, wq, f, g = i["x"], p["wq"], p["f"], p["g"]
    q = (x @ wq).reshape(B, T, NH, HD)
    qh = q.permute(0, 2, 1, 3)
    ang = torch.cat([f, f], dim=-1)
    x1, x2 = qh[..., :HD // 2], qh[..., HD // 2:]
    r = qh * torch.cos(ang) + torch.cat([-x2, x1], dim=-1) * torch.sin(ang)
    y = r.permute(0, 2, 1, 3).reshape(B, T, C)
    z = torch.cat([y, torch.tanh(x[:, 0:1, :]), torch.sin(y[:, 1:3, :])], dim=1)
    w = z.permute(2, 0, 1) * g
    # dmc folds sin(0.5) to a float32 constant: round it the same way
    s05 = torch.tensor(0.479425538604203, dtype=torch.float32).to(x.dtype)
    # dmc folds -log(100) to a float32 constant too
    nl = torch.tensor(-4.605170185988091, dtype=torch.float32).to(x.dtype)
    inv = torch.exp(torch.arange(0, HD, 2, dtype=x.dtype) / HD * nl)
    tab = torch.cat([torch.outer(torch.arange(T, dtype=x.dtype), inv),
                     torch.outer(torch.arange(1, 2 * T, 2, dtype=x.dtype), inv)], dim=-1)
    rq = qh * torch.cos(tab) + torch.cat([-x2, x1], dim=-1) * torch.sin(tab)
    return ((w * w).mean() + (torch.cos(ang) * s05).mean() + torch.cat([f], dim=0).mean()
            + (rq * rq).mean() / 4 + torch.arange(5, dtype=x.dtype).sum() / 100)


def repeat_kv_loss(torch, F, p, i):
    B, T = 2, 3
    x, wq, wk = i["x"], p["wq"], p["wk"]
    q = (x @ wq.t()).reshape(B, T, 4, 2).permute(0, 2, 1, 3)
    k = (x @ wk.t()).reshape(B, T, 2, 2).permute(0, 2, 1, 3)
    kr = torch.repeat_interleave(k, 2, dim=1)     # Hugging Face's repeat_kv
    z = torch.tanh(q @ kr.transpose(-1, -2))
    kx = k.reshape(B, 2, 1, T, 2).expand(B, 2, 2, T, 2).reshape(B, 4, T, 2)
    kb = k.reshape(B, 2, 1, T, 2).expand(B, 2, 2, T, 2).reshape(1, 4, B * T, 2)
    vb = (k * 2).reshape(B, 2, 1, T, 2).expand(B, 2, 2, T, 2).reshape(1, 4, B * T, 2)
    ob = torch.softmax(q.reshape(1, 4, B * T, 2) @ kb.transpose(-1, -2), dim=-1) @ vb
    return ((z * z).mean() + (kr * kr * kr).mean() / 4 + (kx * kx * q).mean()
            + torch.tanh(x * p["wrow"].expand(B, T, -1)).mean() + (ob * ob).mean())


def _lin_params(prefix, n_in, n_out):
    return [(prefix + ".weight", (n_in, n_out), ("normal", (2.0 / (n_in + n_out)) ** 0.5)),
            (prefix + ".bias", (n_out,), ("normal", 0.1))]


MODELS = [
    ("elementwise", {"x": ((4, 6), "f32")},
     [("a", (4, 6), ("normal", 1.0)), ("b", (4, 6), ("normal", 1.0)),
      ("c", (4, 6), ("normal", 1.0))],
     elementwise_loss),
    ("broadcast", {"x": ((5, 7), "f32")},
     [("w", (7,), ("normal", 1.0)), ("col", (5,), ("normal", 1.0)), ("s", (), ("positive",)),
      ("d", (7,), ("positive",)), ("row", (1, 7), ("normal", 1.0)),
      ("m", (5, 7), ("normal", 1.0))],
     broadcast_loss),
    ("reduce", {"x": ((3, 4, 5), "f32")},
     [("w", (4, 5), ("normal", 1.0)), ("v", (5,), ("normal", 1.0))],
     reduce_loss),
    ("layout", {"x": ((2, 3, 4), "f32")},
     [("wq", (4, 4), ("normal", 0.5)), ("p", (4, 3), ("normal", 1.0)),
      ("wo", (2, 5), ("normal", 0.5)), ("g", (15,), ("normal", 1.0))],
     layout_loss),
    ("layers", {"x": ((2, 3, 4), "f32")},
     [("w", (4, 4), ("normal", 0.5)), ("gate", (4,), ("positive",))]
     + _lin_params("shared", 4, 4)
     + sum([_lin_params("stack.%d.fc" % k, 4, 8) + _lin_params("stack.%d.proj" % k, 8, 4)
            for k in range(3)], []),
     layers_loss),
    ("xent", {"x": ((3, 4, 5), "f32"), "y": ((3, 4), ("i32", 7))},
     [("wte", (5, 7), ("normal", 1.0)), ("b", (7,), ("normal", 0.1)),
      ("ln", (5,), ("positive",))],
     xent_loss),
    ("transformer", {"ids": ((2, 5), ("i32", 7))},
     [("table", (7, 6), ("normal", 1.0)), ("lnw", (6,), ("positive",)),
      ("lnb", (6,), ("normal", 0.5)), ("wqkv", (6, 18), ("normal", 0.5)),
      ("w2", (5, 6), ("normal", 1.0))],
     transformer_loss),
    ("repeat_kv", {"x": ((2, 3, 8), "f32")},
     [("wq", (8, 8), ("normal", 0.5)), ("wk", (4, 8), ("normal", 0.5)), ("wrow", (1, 8), ("normal", 0.5))],
     repeat_kv_loss),
    ("windows", {"x": ((2, 3, 4), "f32")},
     [("wr", (8, 4), ("normal", 0.5)), ("wf", (4, 3, 4), ("normal", 0.5)), ("bf", (3, 4), ("normal", 1.0)),
      ("wo", (4, 4), ("normal", 0.5)), ("wn", (3, 4), ("normal", 0.5)), ("wc", (3, 4), ("normal", 0.5))],
     windows_loss),
    ("slice_views", {"x": ((2, 3, 4), "f32")},
     [("ws", (4, 8), ("normal", 0.5)), ("wa", (4, 12), ("normal", 0.5)), ("we", (4, 8), ("normal", 0.5)),
      ("wm", (2, 4, 4), ("normal", 0.5)), ("bv", (8,), ("normal", 1.0))],
     slice_views_loss),
    ("unreached", {"x": ((4, 3), "f32")},
     [("spare", (2,), ("positive",))] + _lin_params("fc", 3, 2) + _lin_params("unused", 3, 2)
     + [("side", (3,), ("positive",))],
     unreached_loss, ("adamw", {"lr": 0.1, "weight_decay": 0.1}), ["spare", "unused.weight", "unused.bias", "side"]),
    ("keepdim", {"x": ((3, 4, 6), "f32")},
     [("v", (6, 6), ("normal", 0.5)), ("norm.weight", (6,), ("positive",))],
     keepdim_loss),
    ("rope", {"x": ((2, 3, 8), "f32")},
     [("wq", (8, 8), ("normal", 0.5)), ("f", (3, 2), ("normal", 1.0)), ("g", (2, 6), ("normal", 1.0))],
     rope_loss),
]


# ---------------------------------------------------------------------------------------

def make_data(np, inputs, params, seed):
    rng = np.random.default_rng(seed)
    init = {}
    for pname, shape, kind in params:
        if kind[0] == "positive":
            v = rng.uniform(0.5, 1.5, size=shape)
        else:
            v = rng.standard_normal(size=shape) * kind[1]
        init[pname] = np.asarray(v, dtype=np.float32)
    batches = {}
    for iname, (shape, kind) in inputs.items():
        if kind == "f32":
            batches[iname] = rng.standard_normal(size=(STEPS,) + shape).astype(np.float32)
        else:
            batches[iname] = rng.integers(0, kind[1], size=(STEPS,) + shape).astype(np.int32)
    return init, batches


def torch_run(torch, init, batches, loss_fn, params, dtype, optim=("sgd", {"lr": LR})):
    """STEPS steps of the optimizer (plain SGD unless the model names another); returns
    (losses, grads after step 1, final params)."""
    import numpy as np
    import torch.nn.functional as F
    p = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in init.items()}
    make = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[optim[0]]
    opt = make([p[n] for n, _, _ in params], **optim[1])
    losses, grads1 = [], None
    for s in range(STEPS):
        i = {}
        for n, v in batches.items():
            i[n] = torch.tensor(v[s], dtype=torch.int64 if v.dtype.kind == "i" else dtype)
        opt.zero_grad()
        loss = loss_fn(torch, F, p, i)
        loss.backward()
        losses.append(loss.item())
        if grads1 is None:
            grads1 = {n: (t.grad.detach().double().numpy().copy() if t.grad is not None
                          else np.zeros(t.shape)) for n, t in p.items()}
        opt.step()
    return losses, grads1, {n: t.detach().double().numpy() for n, t in p.items()}


def run_dmc(dmc, dm_file, tmp, args):
    return dmcrun.run_dmc(dmc, dm_file, tmp, args, timeout=120)


def check_losses(model, got, want):
    """Relative error of every printed loss; returns the failure messages."""
    if len(got) != len(want):
        raise Failure("%s: dmc printed %d step losses, expected %d" % (model, len(got), len(want)))
    rels = [abs(g - w) / abs(w) for g, w in zip(got, want)]
    at = max(range(len(rels)), key=lambda k: rels[k])
    print("%-11s losses  max rel error %.3g (bound %.0e); dmc %s; torch %s"
          % (model, rels[at], LOSS_RTOL, ", ".join("%.7g" % v for v in got),
             ", ".join("%.7g" % v for v in want)))
    if rels[at] > LOSS_RTOL:
        return ["%s: loss of step %d: dmc %.9g vs torch %.9g, relative error %.3g > %.0e"
                % (model, at + 1, got[at], want[at], rels[at], LOSS_RTOL)]
    return []


def check_tensors(np, model, what, params, got, want, ref64, atol, rtol):
    """Element-wise |got - want| <= atol + rtol * |want| for every parameter; returns the
    failure messages."""
    failures = []
    extra = sorted(set(got) - set(n for n, _, _ in params))
    if extra:
        failures.append("%s %s: dmc wrote tensors the torch mirror does not know: %s"
                        % (model, what, ", ".join(extra)))
    for name, shape, _ in params:
        if name not in got:
            failures.append("%s %s: tensor '%s' missing from dmc's file" % (model, what, name))
            continue
        g = got[name].astype(np.float64)
        w = want[name]
        if g.shape != tuple(shape):
            failures.append("%s %s: '%s' has shape %s, expected %s"
                            % (model, what, name, list(g.shape), list(shape)))
            continue
        err = np.abs(g - w)
        ratio = err / (atol + rtol * np.abs(w))
        k = dmcrun.worst_at(ratio)
        print("%-11s %-7s %-18s max abs error %.3g (max |torch| %.3g, error/bound %.3g; "
              "torch f32 vs f64 %.3g)"
              % (model, what, name, float(err.max()), float(np.abs(w).max()),
                 float(ratio.flat[k]), float(np.max(np.abs(w - ref64[name])))))
        if not ratio.flat[k] <= 1.0:
            idx = np.unravel_index(k, g.shape)
            failures.append("%s %s: %s%s: dmc %.9g vs torch %.9g, error %.3g > bound %.3g "
                            "(%.0e + %.0e * |torch|)"
                            % (model, what, name, list(idx), g[idx], w[idx], err[idx],
                               atol + rtol * abs(w[idx]), atol, rtol))
    return failures


def check_unchanged(np, model, names, init, final):
    """Parameters the loss does not reach: exactly their initial values after the steps."""
    failures = []
    for name in names:
        same = final.get(name) is not None and np.array_equal(final[name], init[name])
        print("%-11s %-7s %-18s %s" % (model, "frozen", name, "unchanged" if same else "CHANGED"))
        if not same:
            failures.append("%s: '%s' does not reach the loss but changed in training" % (model, name))
    return failures


def run_checks(dmc, root, np, torch):
    import stio
    torch.manual_seed(0)
    torch.set_num_threads(1)  # small tensors; keeps the reference deterministic
    failures = []
    with tempfile.TemporaryDirectory(prefix="dmc-ref-ops-") as tmp:
        for seed, (model, inputs, params, loss_fn, *rest) in enumerate(MODELS):
            optim = rest[0] if rest else ("sgd", {"lr": LR})
            unreached = rest[1] if len(rest) > 1 else []
            dm_file = os.path.join(root, "tests", "ref", "ops", model + ".dm")
            init, batches = make_data(np, inputs, params, 1000 + seed)
            paths = {k: os.path.join(tmp, "%s.%s.safetensors" % (model, k))
                     for k in ("init", "batches", "grads", "final")}
            stio.save(init, paths["init"])
            stio.save(batches, paths["batches"])
            try:
                d_losses = run_dmc(dmc, dm_file, tmp,
                                   ["--init", paths["init"], "--batch-file", paths["batches"],
                                    "--steps", str(STEPS), "--dump-grads", paths["grads"],
                                    "--save", paths["final"]])
                t_losses, t_grads, t_final = torch_run(torch, init, batches, loss_fn, params,
                                                       torch.float32, optim)
                _, t_grads64, t_final64 = torch_run(torch, init, batches, loss_fn, params,
                                                    torch.float64, optim)
                fails = check_losses(model, d_losses, t_losses)
                fails += check_tensors(np, model, "grad", params, stio.load(paths["grads"]),
                                      t_grads, t_grads64, GRAD_ATOL, GRAD_RTOL)
                d_final = stio.load(paths["final"])
                fails += check_tensors(np, model, "weight", params, d_final,
                                       t_final, t_final64, WEIGHT_ATOL, 0.0)
                fails += check_unchanged(np, model, unreached, init, d_final)
                if fails:
                    raise Failure("\n".join(fails))
            except Failure as e:
                failures.append(str(e))
                print("FAIL: %s" % e, file=sys.stderr)
            except subprocess.TimeoutExpired as e:
                failures.append("%s: timed out: %s" % (model, e))
                print("FAIL: %s: timed out: %s" % (model, e), file=sys.stderr)
    if failures:  # every model is tried: the summary names each that failed
        raise Failure("%d of %d models differ from PyTorch: %s"
                      % (len(failures), len(MODELS), ", ".join(sorted(set(f.split(":")[0].split()[0] for f in failures)))))
    return ("%d op models (tests/ref/ops/*.dm) match PyTorch: losses of %d optimizer steps, step-1 gradients, final "
            "weights; parameters off the loss unchanged" % (len(MODELS), STEPS))


def main(argv):
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
