"""test_compress.py DMC SRCROOT BACKEND: gradient compression on the data axis (--compress)
against a reference implementation of each rule written here, in torch and numpy.

examples/mlp.dm (B=16, D=48, H=64, K=10, AdamW as in the file) trains STEPS steps on
data=2 from weights and batches made here (--init, --batch-file). The reference trains
the same model in torch as two ranks: each computes its partial gradient on its 8 rows
(its cross-entropy summed, over the whole batch's 16), the partials go through the rule
as docs/parallelism.md states it, and torch.optim.AdamW updates from the result:
  bf16, fp16     each rank's gradient rounded to 16 bits (torch's bfloat16, numpy's
                 float16: round to nearest even), the two added in float32, the sum rounded;
  topk:RATIO     per gradient, residual + gradient; the round(RATIO n) (at least 1) largest
                 in magnitude (a stable sort: ties to the lower index) sent and zeroed in
                 the residual; the result the two ranks' pieces added into zeros;
  powersgd:R     per matrix (vectors summed exactly): M = residual + gradient, P = M Q
                 summed over ranks, Gram-Schmidt on its columns (dot products and norms
                 in float64), Q = M^T P per rank, residual = M - P Q_rank^T, Q summed,
                 result P Q^T; Q starts from splitmix64 of (seed, parameter number) as
                 dmrt_comm.h says, and one with a zero column is drawn again.
Compared: every step's loss (relative 1e-5), the step-1 gradient (--dump-grads; absolute
1e-6, or for bf16/fp16 one unit of the format's last place where the two float32
partials sit on either side of a rounding boundary, at most 0.5% of elements) and the
final weights (absolute 1e-5). Also: topk:1 equals the uncompressed run bit for bit (also
with --accumulate 2); data=2 x pipeline=2 equals data=2 under powersgd:2 and topk (each
stage's residuals and factors in its own state); --explain=json's bytes per step are the
formulas of docs/parallelism.md (under ZeRO: its reduce-scatters' bytes); bf16 and fp16
under ZeRO 1 and 2 (16-bit reduce-scatters) equal the allreduce's runs bit for bit, and ZeRO 3
matches the reference; top-k and PowerSGD with ZeRO, and bad modes, are refused with their
messages. BACKEND threads runs all of it; mpi (suite heavy) the reference comparisons.
Exit 77 (a meson skip) without torch, or for mpi without mpirun.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import dmcrun  # noqa: E402
import stio  # noqa: E402
from dmcrun import Failure, import_reference  # noqa: E402
from test_mlp import model_signature  # noqa: E402

B, D, H, K = 16, 48, 64, 10
STEPS = 6
SEED = 7
RANKS = 2
PARAMS = [("fc1.weight", (D, H)), ("fc1.bias", (H,)), ("fc2.weight", (H, H)), ("fc2.bias", (H,)),
          ("fc3.weight", (H, K)), ("fc3.bias", (K,))]
MODES = ["bf16", "fp16", "topk:0.05", "topk:1", "powersgd:2", "powersgd:1"]
LOSS_RTOL, GRAD_ATOL, WEIGHT_ATOL = 1e-5, 1e-6, 1e-5

M64 = (1 << 64) - 1
GOLDEN = 0x9e3779b97f4a7c15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)


def random_q(np, n, seed, stream):
    """dmrt_powersgd_random: uniform in [-1, 1), multiples of 2^-23."""
    key = mix64((seed + GOLDEN * (stream + 1)) & M64)
    out = np.empty(n, np.float32)
    for i in range(n):
        z = mix64((key + GOLDEN * (i + 1)) & M64)
        out[i] = ((z >> 40) - 8388608) / 8388608.0
    return out


class Reference:
    """The rules, state and all, for RANKS ranks (numpy float32; products in torch)."""

    def __init__(self, np, torch, mode):
        self.np, self.torch, self.mode = np, torch, mode
        self.kind, _, arg = mode.partition(":")
        self.ratio = float(arg) if self.kind == "topk" else None
        self.rank = int(arg) if self.kind == "powersgd" else None
        self.residual = {}  # (rank, name) -> float32 array
        self.q = {}         # name -> float32 (cols, r)

    def reduce(self, partials, step):
        """partials: per rank, name -> float32 array; returns name -> the result."""
        return {name: getattr(self, self.kind)(name, p, [pr[name] for pr in partials], step)
                for p, (name, _) in enumerate(PARAMS)}

    def half(self, x, fmt):
        np, torch = self.np, self.torch
        if fmt == "fp16":
            return x.astype(np.float16).astype(np.float32)
        return torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()

    def bf16(self, name, p, grads, step):
        acc = self.half(grads[0], "bf16")
        for g in grads[1:]:
            acc = acc + self.half(g, "bf16")
        return self.half(acc, "bf16")

    def fp16(self, name, p, grads, step):
        acc = self.half(grads[0], "fp16")
        for g in grads[1:]:
            acc = acc + self.half(g, "fp16")
        return self.half(acc, "fp16")

    def topk(self, name, p, grads, step):
        np = self.np
        out = np.zeros(grads[0].size, np.float32)
        n = grads[0].size
        k = min(n, max(1, int(np.floor(self.ratio * n + 0.5))))
        for r, g in enumerate(grads):
            acc = self.residual.get((r, name), np.zeros(n, np.float32)) + g.reshape(-1)
            keep = np.argsort(-np.abs(acc), kind="stable")[:k]
            out[keep] += acc[keep]
            acc[keep] = 0
            self.residual[(r, name)] = acc
        return out.reshape(grads[0].shape)

    def orthonormalise(self, P):
        np = self.np
        for c in range(P.shape[1]):
            for d in range(c):
                dot = np.float32(np.dot(P[:, d].astype(np.float64), P[:, c].astype(np.float64)))
                P[:, c] -= dot * P[:, d]
            norm = np.float32(np.sqrt(np.dot(P[:, c].astype(np.float64), P[:, c].astype(np.float64))))
            if norm > 0:
                P[:, c] /= norm
        return P

    def powersgd(self, name, p, grads, step):
        np, torch, r = self.np, self.torch, self.rank
        shape = grads[0].shape
        rows, cols = (int(np.prod(shape[:-1])), shape[-1]) if len(shape) >= 2 else (1, shape[0])
        if len(shape) < 2 or r * (rows + cols) >= rows * cols:
            acc = grads[0].copy()
            for g in grads[1:]:
                acc = acc + g
            return acc
        if name not in self.q:
            self.q[name] = random_q(np, cols * r, SEED, p).reshape(cols, r)
        mm = lambda a, b: (torch.from_numpy(np.ascontiguousarray(a)) @ torch.from_numpy(np.ascontiguousarray(b))).numpy()
        Q = self.q[name]
        Ms = [self.residual.get((k, name), np.zeros((rows, cols), np.float32)) + g.reshape(rows, cols)
              for k, g in enumerate(grads)]
        P = mm(Ms[0], Q)
        for M in Ms[1:]:
            P = P + mm(M, Q)
        P = self.orthonormalise(P)
        Qsum = None
        for k, M in enumerate(Ms):
            Qk = mm(M.T, P)
            self.residual[(k, name)] = M - mm(P, Qk.T)
            Qsum = Qk if Qsum is None else Qsum + Qk
        result = mm(P, Qsum.T)
        if (np.abs(Qsum).sum(axis=0) == 0).any():
            Qsum = random_q(np, cols * r, SEED, p + (step << 32)).reshape(cols, r)
        self.q[name] = Qsum
        return result.reshape(shape)


def make_data(np, torch):
    g = torch.Generator().manual_seed(4321)
    init = {}
    for name, shape in PARAMS:
        bound = (6.0 / (shape[0] + shape[1])) ** 0.5 if len(shape) == 2 else 0.1
        init[name] = ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * bound).numpy().astype(np.float32)
    rng = np.random.default_rng(8765)
    xs = rng.random((STEPS, B, D), dtype=np.float64).astype(np.float32)
    ys = rng.integers(0, K, size=(STEPS, B)).astype(np.int32)
    return init, xs, ys


def write_data(np, torch, tmp):
    """make_data's, and the trainer's options that read them from files in tmp."""
    init, xs, ys = make_data(np, torch)
    files = [os.path.join(tmp, "init.safetensors"), os.path.join(tmp, "batches.safetensors")]
    stio.save(init, files[0])
    stio.save({"x": xs, "y": ys}, files[1])
    return init, xs, ys, ["--init", files[0], "--batch-file", files[1]]


def partial_gradients(torch, params, x, y, norm, ranks=RANKS):
    """Each rank's loss share and gradient: cross-entropy of its rows summed, over B."""
    import torch.nn.functional as F
    losses, partials = [], []
    for r in range(ranks):
        rows = slice(r * B // ranks, (r + 1) * B // ranks)
        p = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
        xb = torch.tensor(x[rows])
        xn = (xb - torch.tensor(norm[0], dtype=torch.float32)) / torch.tensor(norm[1], dtype=torch.float32)
        h1 = torch.relu(xn @ p["fc1.weight"] + p["fc1.bias"])
        h2 = torch.relu(h1 @ p["fc2.weight"] + p["fc2.bias"])
        logits = h2 @ p["fc3.weight"] + p["fc3.bias"]
        loss = F.cross_entropy(logits, torch.tensor(y[rows], dtype=torch.int64), reduction="sum") / B
        loss.backward()
        losses.append(loss.item())
        partials.append({n: t.grad.numpy().copy() for n, t in p.items()})
    return sum(losses), partials


def reference_run(np, torch, mode, init, xs, ys, norm):
    """(losses, step-1 gradients, final weights) of the two ranks under the rule."""
    ref = Reference(np, torch, mode)
    leaves = {n: torch.tensor(v.copy()) for n, v in init.items()}
    opt = torch.optim.AdamW([leaves[n] for n, _ in PARAMS], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-4)
    losses, grads1 = [], None
    for s in range(STEPS):
        loss, partials = partial_gradients(torch, {n: t.numpy().copy() for n, t in leaves.items()}, xs[s], ys[s], norm)
        reduced = ref.reduce(partials, s + 1)
        if grads1 is None:
            grads1 = {n: v.copy() for n, v in reduced.items()}
        for n, t in leaves.items():
            t.grad = torch.from_numpy(np.ascontiguousarray(reduced[n], dtype=np.float32))
        opt.step()
        losses.append(loss)
    return losses, grads1, {n: t.numpy() for n, t in leaves.items()}


def dmc_run(dmc, dm_file, tmp, tag, files, backend, extra):
    weights, grads = os.path.join(tmp, "w-%s.safetensors" % tag), os.path.join(tmp, "g-%s.safetensors" % tag)
    args = ["--set", "B=%d,D=%d,H=%d,K=%d" % (B, D, H, K), "--steps", str(STEPS), "--seed", str(SEED),
            "--save", weights, "--dump-grads", grads, "--backend", backend] + files + extra
    losses = dmcrun.run_dmc(dmc, dm_file, tmp, args, timeout=300)
    return losses, stio.load(grads), stio.load(weights)


def ulp16(np, x, kind):
    """One unit in the last place of the 16-bit format at |x| (its spacing there)."""
    mant = 7 if kind == "bf16" else 10
    smallest = -133 if kind == "bf16" else -24
    e = np.floor(np.log2(np.maximum(np.abs(x), 1e-38)))
    return np.exp2(np.maximum(e - mant, smallest))


def compare(np, mode, got, want):
    """The worst differences; raises Failure past the bounds."""
    losses, grads, weights = got
    want_losses, want_grads, want_weights = want
    # each difference through nan_worst: a NaN is the worst (max() over one depends on its place)
    nan_worst = dmcrun.nan_worst
    loss_err = max(nan_worst(abs(a - b) / abs(b)) for a, b in zip(losses, want_losses))
    kind = mode.partition(":")[0]
    grad_err, flips, total = 0.0, 0, 0
    for name, _ in PARAMS:
        d = np.abs(grads[name].astype(np.float64) - want_grads[name])
        total += d.size
        if kind in ("bf16", "fp16"):
            # a one-ulp step where the float32 partials straddle a rounding boundary
            over = d > GRAD_ATOL
            flips += int(over.sum())
            if (d[over] > 1.01 * ulp16(np, want_grads[name][over], kind) + GRAD_ATOL).any():
                raise Failure("%s: the gradient of %s differs by more than one 16-bit unit" % (mode, name))
            d = d[~over]
        grad_err = max(grad_err, nan_worst(float(d.max())) if d.size else 0.0)
    weight_err = max(nan_worst(float(np.max(np.abs(weights[n] - want_weights[n])))) for n, _ in PARAMS)
    print("%-12s losses %.1e (bound %.0e), step-1 gradient %.1e (%.0e; %d of %d elements a 16-bit unit apart), "
          "weights %.1e (%.0e)" % (mode, loss_err, LOSS_RTOL, grad_err, GRAD_ATOL, flips, total, weight_err, WEIGHT_ATOL))
    if loss_err > LOSS_RTOL:
        raise Failure("%s: losses %s, reference %s" % (mode, losses, want_losses))
    if grad_err > GRAD_ATOL or flips > 0.005 * total:
        raise Failure("%s: step-1 gradient differs by %.3g (%d elements a unit apart)" % (mode, grad_err, flips))
    if weight_err > WEIGHT_ATOL:
        raise Failure("%s: final weights differ by %.3g" % (mode, weight_err))


def same_bits(np, what, a, b):
    """Runs a and b ((losses, grads, weights)) are the same, weights and gradients bit for bit."""
    if a[0] != b[0]:
        raise Failure("%s: losses %s vs %s" % (what, a[0], b[0]))
    for name, _ in PARAMS:
        for part, x, y in (("weights", a[2], b[2]), ("gradient", a[1], b[1])):
            if not np.array_equal(x[name], y[name]):
                raise Failure("%s: %s of %s differ by %.3g" % (what, part, name, float(np.max(np.abs(x[name] - y[name])))))
    print("%-40s the same, bit for bit" % what)


def close_runs(np, what, a, b):
    """Runs a and b ((losses, grads, weights)) agree within the reference comparison's bounds:
    the same rule, its sums in another order."""
    loss_err = max(abs(x - y) / abs(y) for x, y in zip(a[0], b[0]))
    weight_err = max(float(np.max(np.abs(a[2][n] - b[2][n]))) for n, _ in PARAMS)
    if len(a[0]) != len(b[0]) or loss_err > LOSS_RTOL or weight_err > WEIGHT_ATOL:
        raise Failure("%s: losses %.3g apart (bound %.0e), weights %.3g (%.0e)" % (what, loss_err, LOSS_RTOL, weight_err,
                                                                                 WEIGHT_ATOL))
    print("%-55s losses %.1e apart, weights %.1e" % (what, loss_err, weight_err))


def explain_json(dmc, dm_file, mesh, mode, extra=()):
    cmd = [dmc, "--explain=json", dm_file, "--set", "B=%d,D=%d,H=%d,K=%d" % (B, D, H, K), "--mesh", mesh, "--compress",
           mode] + list(extra)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    if r.returncode != 0:
        raise Failure("`%s` exited %d: %s" % (" ".join(cmd), r.returncode, r.stderr))
    return json.loads(r.stdout)["compress"]


def check_explain(np, dmc, dm_file):
    """--explain's bytes per rank and step against docs/parallelism.md's formulas (n ranks
    of data; a gradient of e elements): plain 8 e (n-1)/n; 16-bit half that; top-k 8 k (n-1);
    PowerSGD 8 r (rows + cols) (n-1)/n per matrix, vectors as plain."""
    for ranks in (2, 4):
        f = (ranks - 1) / ranks
        sizes = [int(np.prod(s)) for _, s in PARAMS]
        plain = sum(8 * e * f for e in sizes)
        for mode in ["bf16", "fp16", "topk:0.05", "topk:1", "powersgd:2"]:
            kind, _, arg = mode.partition(":")
            if kind in ("bf16", "fp16"):
                want = plain / 2
            elif kind == "topk":
                want = sum(8 * max(1, int(np.floor(float(arg) * e + 0.5))) * (ranks - 1) for e in sizes)
            else:
                r = int(arg)
                want = sum(8 * r * (s[0] + s[1]) * f if len(s) == 2 and r * (s[0] + s[1]) < s[0] * s[1] else 8 * int(np.prod(s)) * f
                           for _, s in PARAMS)
            got = explain_json(dmc, dm_file, "data=%d" % ranks, mode)
            if abs(got["sent_bytes_per_rank"] - want) > 1 or abs(got["uncompressed_sent_bytes_per_rank"] - plain) > 1:
                raise Failure("--explain data=%d --compress %s: sent %s, uncompressed %s; formulas %.0f, %.0f"
                              % (ranks, mode, got["sent_bytes_per_rank"], got["uncompressed_sent_bytes_per_rank"], want, plain))
        # under ZeRO: its reduce-scatters, 4 e (n-1)/n in f32, in 16 bits half that
        for zero in ("1", "3"):
            got = explain_json(dmc, dm_file, "data=%d" % ranks, "bf16", ["--zero", zero])
            if abs(got["sent_bytes_per_rank"] - plain / 4) > 1 or abs(got["uncompressed_sent_bytes_per_rank"] - plain / 2) > 1:
                raise Failure("--explain data=%d --zero %s --compress bf16: sent %s, in f32 %s; formulas %.0f, %.0f"
                              % (ranks, zero, got["sent_bytes_per_rank"], got["uncompressed_sent_bytes_per_rank"],
                                 plain / 4, plain / 2))
    print("--explain's bytes per step: the formulas, on data=2 and data=4, every mode, and under ZeRO")


def check_refusals(dmc, dm_file, tmp):
    """What is not built says so before anything runs."""
    sets = ["--set", "B=%d,D=%d,H=%d,K=%d" % (B, D, H, K)]
    cases = [([dmc, "--check", dm_file, "--mesh", "data=2", "--zero", "1", "--compress", "topk:0.05"] + sets,
              "--compress topk:0.05 does not combine with --zero 1"),
             ([dmc, "--check", dm_file, "--mesh", "data=2", "--zero", "2", "--compress", "powersgd:2"] + sets,
              "--compress powersgd:2 does not combine with --zero 2"),
             ([dmc, "--check", dm_file, "--compress", "topk:0"], "--compress topk:RATIO takes a fraction in (0, 1], got '0'"),
             ([dmc, "--check", dm_file, "--compress", "powersgd:x"], "powersgd:RANK takes an integer from 1 to 1024"),
             ([dmc, "--check", dm_file, "--compress", "int8"], "takes bf16, fp16, topk:RATIO, powersgd:RANK or none"),
             ([dmc, "--plan", dm_file, "--devices", "2", "--compress", "bf16"], "--plan does not search gradient compression")]
    for cmd, message in cases:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
        if r.returncode == 0 or message not in r.stderr:
            raise Failure("`%s` exited %d without '%s':\n%s" % (" ".join(cmd), r.returncode, message, r.stderr))
    print("refused with their messages: top-k and PowerSGD with ZeRO, bad modes, --plan")


def main():
    dmc, root, backend = sys.argv[1:4]
    if backend == "mpi" and not shutil.which("mpirun"):
        print("SKIP: mpirun is not installed")
        return 77
    dmcrun.require_target()  # the GPU suite's run (DMC_TEST_TARGET=cuda) needs a GPU
    mods = import_reference()
    if mods is None:
        return 77
    np, torch = mods
    torch.set_num_threads(1)
    dm_file = os.path.join(os.path.abspath(root), "examples", "mlp.dm")
    with open(dm_file) as f:
        norm = model_signature(f.read())
    tmp = tempfile.mkdtemp(prefix="dmc-compress-")
    failures = []
    try:
        init, xs, ys, files = write_data(np, torch, tmp)
        runs = {}
        for mode in MODES:
            try:
                runs[mode] = dmc_run(dmc, dm_file, tmp, mode.replace(":", "_"), files, backend,
                                     ["--mesh", "data=2", "--compress", mode])
                compare(np, mode, runs[mode], reference_run(np, torch, mode, init, xs, ys, norm))
            except Failure as e:
                print("FAIL %s" % e)
                failures.append(mode)
        checks = [("topk:1 = uncompressed", lambda: same_bits(
            np, "data=2, topk:1 and uncompressed", runs["topk:1"],
            dmc_run(dmc, dm_file, tmp, "plain", files, backend, ["--mesh", "data=2"])))]
        if backend == "threads":
            checks += [
                ("accumulate", lambda: same_bits(
                    np, "data=2 --accumulate 2, topk:1 and uncompressed",
                    dmc_run(dmc, dm_file, tmp, "acc_topk", files, backend, ["--mesh", "data=2", "--accumulate", "2",
                                                                             "--compress", "topk:1"]),
                    dmc_run(dmc, dm_file, tmp, "acc", files, backend, ["--mesh", "data=2", "--accumulate", "2"]))),
            ]
        # bit for bit with data=2 on the C target only: on the CUDA one a data=2 program sums
        # its bias gradients in the weight gradient's product (cuBLASLt's BGRADA epilogue)
        # and a pipeline's by the sum's own kernel (not folded there: codegen/emit_bias_grad.c),
        # which add the same terms in another order; the C target checks the property
        if backend == "threads" and dmcrun.TARGET != "cuda":
            checks += [
                ("pipeline powersgd", lambda: same_bits(
                    np, "data=2 x pipeline=2 and data=2, powersgd:2", runs["powersgd:2"],
                    dmc_run(dmc, dm_file, tmp, "pipe_psgd", files, backend, ["--mesh", "data=2,pipeline=2", "--compress",
                                                                              "powersgd:2"]))),
                ("pipeline topk", lambda: same_bits(
                    np, "data=2 x pipeline=2 and data=2, topk:0.05", runs["topk:0.05"],
                    dmc_run(dmc, dm_file, tmp, "pipe_topk", files, backend, ["--mesh", "data=2,pipeline=2", "--compress",
                                                                              "topk:0.05"])))]
        if backend == "threads":
            # interleaved chunks: each chunk's buckets compressed in its own function, their
            # residuals and factors after the rank's optimizer state; as data=2 with the same
            # 2 micro-batches (accumulated), summed in another order
            for mode in ("topk:0.05", "powersgd:2"):
                tag = mode.replace(":", "_")
                checks.append(("interleaved " + mode, lambda mode=mode, tag=tag: close_runs(
                    np, "data=2 x pipeline=2 interleaved and data=2, " + mode,
                    dmc_run(dmc, dm_file, tmp, "inter_" + tag, files, backend,
                            ["--mesh", "data=2,pipeline=2", "--microbatches", "2", "--schedule", "interleaved",
                             "--chunks", "2", "--compress", mode]),
                    dmc_run(dmc, dm_file, tmp, "acc2_" + tag, files, backend,
                            ["--mesh", "data=2", "--accumulate", "2", "--compress", mode]))))
        if backend == "threads" and dmcrun.TARGET == "cuda":
            print("pipeline powersgd, pipeline topk: not compared on the CUDA target (bias gradients summed "
                  "in another order by a pipeline's program; bit for bit on the C target)")
        if backend == "threads":
            # ZeRO's reduce-scatters carry the 16-bit values: the same rule element by element
            # (each rank's value rounded, summed in rank order, rounded), so ZeRO 1 and 2 are
            # the allreduce's run bit for bit, and match the reference; ZeRO 3, whose forward
            # reads gathered copies, within the reference's bounds (as it is in f32)
            for mode in ("bf16", "fp16"):
                for zero in ("1", "2", "3"):
                    tag = "%s_zero%s" % (mode, zero)
                    run = (lambda mode=mode, zero=zero, tag=tag: dmc_run(
                        dmc, dm_file, tmp, tag, files, backend, ["--mesh", "data=2", "--zero", zero, "--compress", mode]))
                    what = "data=2 --zero %s and data=2, --compress %s" % (zero, mode)
                    # (the CUDA target updates a ZeRO program's parameters by other kernels than the
                    # flat update of a plain one: there each run against the reference)
                    if zero == "3" or dmcrun.TARGET == "cuda":
                        checks.append((tag, lambda mode=mode, run=run: compare(
                            np, mode, run(), reference_run(np, torch, mode, init, xs, ys, norm))))
                    else:
                        checks.append((tag, lambda mode=mode, run=run, what=what: same_bits(np, what, run(), runs[mode])))
        if backend == "threads":
            checks += [
                ("explain", lambda: check_explain(np, dmc, dm_file)),
                ("refusals", lambda: check_refusals(dmc, dm_file, tmp))]
        for label, check in checks:
            try:
                check()
            except (Failure, KeyError) as e:
                print("FAIL %s: %s" % (label, e))
                failures.append(label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
