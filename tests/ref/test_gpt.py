#!/usr/bin/python3
"""test_gpt.py: PyTorch oracle for examples/gpt.dm (GPT-2), and its Hugging Face
checkpoint loading.

usage: /usr/bin/python3 tests/ref/test_gpt.py DMC SOURCE_ROOT [train|hf]

  train (meson test `ref-gpt-pytorch`, the default)
  hf    (meson test `ref-gpt-hf-checkpoint`)

The model is compiled with a tiny config (--set V=64,T=16,C=32,NH=4,L=2,B=4) and run
with `dmc run` from weights and batches generated here (fixed seeds, written with
stio.py). The reference is gpt_torch.py: the same GPT-2 in float32 torch ops
(layernorm eps 1e-5, HF Conv1D weights [in, out], causal softmax attention over NH
heads, tanh-approximated GELU, tied head, mean cross-entropy). The random weights are
not a fresh model's: layernorm weights in [0.5, 1.5), random layernorm and linear
biases, and weights large enough that attention is peaked and GELU curved, so every
gradient path carries signal. model_signature checks that examples/gpt.dm still has
the structure mirrored there (its lines, and the parameter list `dmc --explain=json`
reports) and fails loudly when the example changes.

train:
  a) step 1: the loss and every parameter gradient (--dump-grads) vs torch autograd;
  b) the logits of that batch vs torch: the trainer does not print outputs, so the
     test builds, next to the trainer, a small C probe (`probe.c` below, through a
     `--cc` wrapper so that it gets exactly dmc's compiler, flags and runtime) that
     loads the weights, calls the model's forward on one batch and writes output
     `logits` with dmrt_st_write; this also checks `forward` against `train_step`;
  c) 10 steps of the file's optimizer as is (adamw lr 1e-3, weight_decay 0.01, betas
     0.9/0.999, eps 1e-8): the 10 printed losses and the --save'd weights vs
     torch.optim.AdamW. The decay is visible here: it moves the layernorm weights and
     embeddings by up to 1.5e-4, 15x the weight bound.
hf:
  a) a file in the layout of Hugging Face's GPT-2 model.safetensors (same keys and
     shapes, "__metadata__": {"format": "pt"}, plus the non-parameter buffers
     h.N.attn.bias f32 [1, 1, T, T] of lower-triangular ones) loads with --init and
     gives the step-1 loss and gradients of torch from the same weights;
  b) the same file with every key prefixed "transformer." (as
     GPT2LMHeadModel.save_pretrained writes it; the tied lm_head.weight is not
     stored) gives bit-identical loss and gradients;
  c) a file whose wpe.weight is [2T, C] (a checkpoint with a longer context), and a
     prefixed one whose h.1.attn.c_attn.weight is stored transposed ([3C, C], the
     nn.Linear layout), each make the trainer exit 1 with a message naming the tensor
     and both shapes.
Each mode runs `dmc run` once with --keep and the later runs of the same program on
the trainer binary it left there (what `dmc run` would build again and run with the
same arguments), to stay fast; train builds a second time, for the probe.

Bounds (element-wise; every measured maximum is printed, with torch float32 vs
float64 for the scale of legitimate float32 noise):
  losses:   |dmc - torch| <= 1e-5 * |torch|
  grads:    |dmc - torch| <= 1e-5 + 1e-4 * |torch|
  logits:   |dmc - torch| <= 3e-5 + 1e-4 * |torch|
  weights:  |dmc - torch| <= 1e-5 after 10 AdamW steps, except:
  key biases: the key third of each h.N.attn.c_attn.bias (elements C..2C-1) after the
  10 steps: |dmc - torch float64| <= 10.2 * lr. That bias adds q.b_k to every score of
  a row, which softmax cancels: its gradient is exactly zero in exact arithmetic and
  rounding noise in float32 (the gradient check holds it to <= 1e-5). AdamW divides m
  by sqrt(v): noise in, steps of up to lr out, of any sign, so torch float32 and float64
  themselves differ by ~3e-3 there. torch float64's value is the exact one (the initial
  bias, decayed); the bound is Adam's: by Cauchy-Schwarz |m_hat / sqrt(v_hat)| <= 1.043
  at t <= 10 with betas 0.9/0.999, 10.17 summed over the 10 steps. These elements do
  not affect the loss, so their noise goes nowhere else.
Justification of the other bounds as in test_mlp.py: both sides sum in float32 in
different orders, a few ulps (6e-8 relative) times cancellation factors; gradients
here are O(0.05..0.4), so 1e-4 relative is >1000x headroom, and the 1e-5 absolute term
covers elements that cancel to near zero. Logits reach ~7 and are sums of 32 products
of O(1) terms at the end of the network: torch float32 vs float64 is ~6e-6 there,
hence the 3e-5 absolute term. Against mutations of the torch mirror (so, dmc bugs of
that kind), the worst error/bound is 2.2 for layernorm eps 1e-6 instead of 1e-5, 16 for
exact instead of tanh GELU, >2e4 for a missing mask, a mask shifted by one or a
missing layernorm bias; AdamW without decay, with half or double the decay, or with
beta2 0.99 moves weights 5e-5..1.5e-4, 5-15x the weight bound.
Measured (this config and seeds; gcc -O3 -march=native build, and clang with ASan and
UBSan): loss errors <= 9.5e-8 relative; gradients <= 4.8e-7 absolute (torch f32 vs
f64: up to 4.3e-7); logits <= 5.8e-6 (torch f32 vs f64 6.1e-6), and forward's loss
the same float as train_step's; weights after 10 steps <= 1.9e-7 (torch f32 vs f64 8.8e-7); key biases
<= 2.9e-3 from float64 (torch f32 vs f64 2.9e-3).

Exit status: 0 pass, 1 failure (message on stderr), 77 torch/numpy unavailable (skip),
2 usage.
"""
import json
import os
import re
import stat
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import dmcrun  # noqa: E402
from dmcrun import Failure  # noqa: E402

V, T, C, NH, L, B = 64, 16, 32, 4, 2, 4
SETS = "V=%d,T=%d,C=%d,NH=%d,L=%d,B=%d" % (V, T, C, NH, L, B)
STEPS = 10
LR, WD = 1e-3, 0.01
LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
LOGIT_ATOL, LOGIT_RTOL = 3e-5, 1e-4
WEIGHT_ATOL = 1e-5
KBIAS_ATOL = 10.2 * LR  # sum over t = 1..10 of Adam's bound below
ADAMW_LINE = "optimizer adamw(lr = 1e-3, weight_decay = 0.01)"

# The lines of examples/gpt.dm that the torch mirror depends on (comments stripped,
# blanks collapsed). If one changes, update gpt_torch.py and this list together.
SIGNATURE = [
    # linear / projection: HF Conv1D, weight [in, out]
    "return x @ weight + bias",
    "return layernorm(x, weight, bias, eps = 1e-5)",
    "dim HS = C / NH",
    # c_attn: HF's fused q | k | v, [C, 3C] stored, computed as [C, 3, C], part P of it
    "return x @ reshape(slice(weight, 1, P, P + 1), [C, C]) + reshape(slice(bias, 0, P, P + 1), [C])",
    "param weight : f32[C, 3, C@tensor] as [C, 3 * C] = normal(0, 0.02)",
    "param bias : f32[3, C@tensor] as [3 * C] = zeros",
    "layer q = part[C, 0]",
    "return q(x, weight, bias)",
    "layer c_attn = fused_qkv[C]",
    "layer k_part = part[C, 1]",
    "layer v_part = part[C, 2]",
    "layer c_proj = projection[C, C]",
    "q = transpose(reshape(c_attn(x), [B, T, NH, HS]), T, NH)",
    "k = transpose(reshape(k_part(x, c_attn.weight, c_attn.bias), [B, T, NH, HS]), T, NH)",
    "v = transpose(reshape(v_part(x, c_attn.weight, c_attn.bias), [B, T, NH, HS]), T, NH)",
    "att = softmax(causal_mask(q @ transpose(k) / sqrt(HS)), -1)",
    "y = reshape(transpose(att @ v, NH, T), [B, T, C])",
    "return c_proj(y)",
    "layer c_fc = linear[C, 4 * C]",
    "layer c_proj = projection[4 * C, C]",
    "return c_proj(gelu(c_fc(x)))",
    "layer ln_1 = norm[C]",
    "layer attn = attention[C, NH]",
    "layer ln_2 = norm[C]",
    "layer mlp = feed_forward[C]",
    "x_attn = x + attn(ln_1(x))",
    "return x_attn + mlp(ln_2(x_attn))",
    "return embed(weight, ids)",
    "return x + weight",
    "input tokens : i32[B@data, T]",
    "input targets : i32[B@data, T]",
    "layer wte = token_embedding[V, C]",
    "layer wpe = position_embedding[T, C]",
    "layer h = repeat L transformer_block[C, NH]",
    "layer ln_f = norm[C]",
    "x = wpe(wte(tokens))",
    "logits = ln_f(h(x)) @ transpose(wte.weight)",
    "loss = cross_entropy(logits, targets)",
    "output logits",
    "minimize loss",
    ADAMW_LINE,
]

# The forward probe, built beside the trainer by the --cc wrapper: loads PARAMS, runs
# forward on the inputs of BATCH (one tensor per input, no step dimension), writes
# output `logits` to OUT and prints the loss.
PROBE_C = r"""
#include "gpt.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    const dmrt_model *m = &gpt_model;
    char err[1024];
    const void *in[16];
    void *own[16] = {0};
    int rc = 1, out = -1;
    dmrt_st_file f;
    if (argc != 4 || m->n_inputs > 16) return 2;
    void *ctx = m->create(0, err, sizeof err);
    if (!ctx) { fprintf(stderr, "probe: %s\n", err); return 1; }
    if (dmrt_st_read(&f, argv[2], err, sizeof err) != 0) {
        fprintf(stderr, "probe: %s\n", err);
        m->destroy(ctx);
        return 1;
    }
    if (dmrt_load_params(m, ctx, argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "probe: %s\n", err);
        goto done;
    }
    for (int i = 0; i < m->n_inputs; i++) {
        const dmrt_tensor_desc *d = &m->inputs[i];
        const dmrt_st_tensor *t = dmrt_st_find(&f, d->name);
        if (!t || t->dtype != d->dtype || t->numel != d->numel) {
            fprintf(stderr, "probe: input '%s' missing or mis-shaped in %s\n", d->name, argv[2]);
            goto done;
        }
        size_t bytes = (size_t)d->numel * dmrt_dtype_size(d->dtype);
        own[i] = dmrt_alloc(bytes);
        if (!own[i]) goto done;
        memcpy(own[i], t->data, bytes);
        in[i] = own[i];
    }
    for (int i = 0; i < m->n_outputs; i++)
        if (strcmp(m->outputs[i].name, "logits") == 0) out = i;
    if (out < 0) { fprintf(stderr, "probe: no output 'logits'\n"); goto done; }
    float loss = 0.0f;
    if (m->forward(ctx, in, &loss) != 0) {
        fprintf(stderr, "probe: forward: %s\n", m->error(ctx));
        goto done;
    }
    const void *data = m->output(ctx, out);
    if (!data || dmrt_st_write(argv[3], 1, &m->outputs[out], &data, err, sizeof err) != 0) {
        fprintf(stderr, "probe: %s\n", data ? err : "output is NULL");
        goto done;
    }
    printf("forward loss %.9g\n", (double)loss);
    rc = 0;
done:
    for (int i = 0; i < 16; i++) dmrt_free(own[i]);
    dmrt_st_close(&f);
    m->destroy(ctx);
    return rc;
}
"""

# `dmc run --cc WRAPPER`: builds the trainer with the real compiler and the same
# arguments, then the probe with main.c replaced by probe.c, into EXE_probe.
WRAPPER_PY = r"""#!%(python)s
import subprocess, sys
REAL, PROBE = %(real)r, %(probe)r
args = sys.argv[1:]
rc = subprocess.call(REAL + args)
mains = [k for k, a in enumerate(args) if a.endswith("/main.c")]
if rc == 0 and (len(mains) != 1 or "-o" not in args):
    sys.exit("cc-wrapper (test_gpt.py): no main.c or -o in dmc's compiler command %%r" %% args)
if rc == 0:
    i, o = mains[0], args.index("-o")
    args[i], args[o + 1] = PROBE, args[o + 1] + "_probe"
    rc = subprocess.call(REAL + args)
sys.exit(rc)
"""


def norm_line(line):
    return " ".join(line.split("#")[0].split())


def model_signature(dmc, src_path, src, specs):
    """Fails unless examples/gpt.dm is the model gpt_torch.py mirrors."""
    body = set(norm_line(ln) for ln in src.splitlines())
    missing = [n for n in SIGNATURE if n not in body]
    if len(re.findall(r"^optimizer ", src, re.M)) != 1:
        missing.append("exactly one optimizer line")
    if missing:
        raise Failure("examples/gpt.dm no longer has %s; update the torch mirror (tests/ref/gpt_torch.py, "
                      "test_gpt.py SIGNATURE)" % ", ".join("'%s'" % m for m in missing))
    r = subprocess.run([dmc, "--explain=json", "--set", SETS, src_path], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    if r.returncode != 0:
        raise Failure("dmc --explain=json %s exited %d:\n%s" % (src_path, r.returncode, r.stderr))
    plan = json.loads(r.stdout)
    got = [(p["name"], p["elements"]) for p in plan["params"]]
    want = [(n, _numel(s)) for n, s in specs]
    if got != want:
        raise Failure("examples/gpt.dm's parameters (dmc --explain=json) are not those of the torch mirror:\n"
                      "  dmc:    %s\n  mirror: %s" % (got, want))
    if [i["name"] for i in plan["inputs"]] != ["tokens", "targets"]:
        raise Failure("examples/gpt.dm's inputs are %s, expected tokens, targets"
                      % [i["name"] for i in plan["inputs"]])


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def run_dmc(dmc, dm_file, tmp, args):
    return dmcrun.run_dmc(dmc, dm_file, tmp, ["--set", SETS] + args, timeout=240)


def run_trainer(exe, tmp, args):
    """Runs a trainer binary that `dmc run --keep` left (the same program `dmc run`
    would build again and run with these arguments); returns its step losses."""
    return dmcrun.step_losses([exe, "--quiet"] + args, tmp, timeout=240)


def run_trainer_failing(exe, tmp, args, what, needles):
    """A trainer run that must exit 1 with an error message holding every needle."""
    cmd = [exe, "--quiet"] + args
    r = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=240)
    msg = r.stderr.strip()
    print("%-12s exit %d: %s" % (what, r.returncode, msg.splitlines()[-1] if msg else "(no message)"))
    if r.returncode != 1:
        raise Failure("%s: `%s` exited %d, expected 1 (a runtime error)\n%s%s"
                      % (what, " ".join(cmd), r.returncode, r.stdout, r.stderr))
    lacking = [n for n in needles if n not in msg]
    if lacking or "error" not in msg:
        raise Failure("%s: the error message does not name %s:\n%s"
                      % (what, ", ".join("'%s'" % n for n in lacking or ["'error'"]), msg))
    if "step 1 " in r.stdout:
        raise Failure("%s: dmc trained a step before failing:\n%s" % (what, r.stdout))


def check_losses(what, got, want):
    dmcrun.check_losses(what, got, want, LOSS_RTOL)


def check_tensors(np, what, names, got, want, atol, rtol, ref64=None, loose=None):
    """Element-wise |got - want| <= bound for every name, where bound = atol + rtol *
    |want|, or loose[name][1] where the mask loose[name][0] is set."""
    failures = []
    worst_all = 0.0
    for name in names:
        w = want[name]
        if name not in got:
            failures.append("%s: tensor '%s' missing from dmc's file" % (what, name))
            continue
        g = got[name].astype(np.float64)
        if g.shape != w.shape:
            failures.append("%s: '%s' has shape %s, expected %s" % (what, name, list(g.shape), list(w.shape)))
            continue
        err = np.abs(g - w)
        bound = atol + rtol * np.abs(w)
        extra = ""
        if loose and name in loose:
            mask, lbound = loose[name]
            bound = np.where(mask, lbound, bound)
            extra = "; loose part %.3g (bound %.3g)" % (float(err[mask].max()), lbound)
            strict = err[~mask]
        else:
            strict = err
        ratio = err / bound
        k = dmcrun.worst_at(ratio)
        worst_all = max(worst_all, float(strict.max()))
        noise = ""
        if ref64 is not None:
            d64 = np.abs(w - ref64[name])
            noise = "; torch f32 vs f64 %.3g" % float(np.max(d64[~loose[name][0]] if loose and name in loose else d64))
        print("%-12s %-24s max abs error %.3g (max |torch| %.3g, worst error/bound %.3g)%s%s"
              % (what, name, float(strict.max()), float(np.abs(w).max()), float(ratio.flat[k]), noise, extra))
        if not ratio.flat[k] <= 1.0:
            idx = np.unravel_index(k, g.shape)
            failures.append("%s: %s%s: dmc %.9g vs torch %.9g, error %.3g > bound %.3g"
                            % (what, name, list(idx), g[idx], w[idx], err[idx], bound[idx]))
    print("%-12s all tensors: max abs error %.3g (outside the loose parts)" % (what, worst_all))
    if failures:
        raise Failure("\n".join(failures))


def make_batches(np, seed, steps):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, V, size=(steps, B, T)).astype(np.int32)
    targets = rng.integers(0, V, size=(steps, B, T)).astype(np.int32)
    return tokens, targets


def step1_check(np, torch, G, what, train, tmp, init, tokens, targets, init_path, batch_path):
    """Trains one step from init_path with train(args) (-> losses); checks the loss and
    the gradients; returns them."""
    names = list(init)
    grads_path = os.path.join(tmp, what + "-grads.safetensors")
    d_losses = train(["--init", init_path, "--batch-file", batch_path, "--steps", "1", "--dump-grads", grads_path])
    t_losses, t_grads, _ = G.train(torch, init, tokens, targets, NH, L, 1, torch.float32)
    _, t_grads64, _ = G.train(torch, init, tokens, targets, NH, L, 1, torch.float64)
    check_losses(what, d_losses, t_losses)
    d_grads = stio_load(grads_path)
    check_tensors(np, what, names, d_grads, t_grads, GRAD_ATOL, GRAD_RTOL, t_grads64)
    return d_losses, d_grads


def stio_load(path):
    import stio
    return stio.load(path)


def real_compiler(exe):
    """The compiler `dmc run` used for exe: $CC if set (dmc's own choice too), else
    clang when the binary says it was built by clang (the ASan build), else cc."""
    if os.environ.get("CC"):
        return os.environ["CC"].split()
    with open(exe, "rb") as f:
        return ["clang"] if b"clang version" in f.read() else ["cc"]


def mode_train(np, torch, G, dmc, src_path, specs, tmp):
    import stio
    names = [n for n, _ in specs]
    init = G.make_init(torch, specs, 1234)
    tokens, targets = make_batches(np, 5678, STEPS)
    init_path = os.path.join(tmp, "init.safetensors")
    batch_path = os.path.join(tmp, "batches.safetensors")
    stio.save(init, init_path)
    stio.save({"tokens": tokens, "targets": targets}, batch_path)

    # a) step-1 loss and gradients (the build kept: its binary tells the compiler for
    # b), and c) runs it again rather than building the same program once more)
    keep = os.path.join(tmp, "build")
    exe = os.path.join(keep, "gpt")
    step1_check(np, torch, G, "step1", lambda a: run_dmc(dmc, src_path, tmp, ["--keep", keep] + a), tmp,
                init, tokens, targets, init_path, batch_path)

    # b) logits of batch 0 from the model's forward, through the probe
    probe_c = os.path.join(tmp, "probe.c")
    with open(probe_c, "w") as f:
        f.write(PROBE_C)
    wrapper = os.path.join(tmp, "cc-wrapper")
    with open(wrapper, "w") as f:
        f.write(WRAPPER_PY % {"python": sys.executable, "real": real_compiler(exe),
                              "probe": probe_c})
    os.chmod(wrapper, stat.S_IRWXU)
    pkeep = os.path.join(tmp, "build-probe")
    run_dmc(dmc, src_path, tmp, ["--cc", wrapper, "--keep", pkeep, "--init", init_path,
                                 "--batch-file", batch_path, "--steps", "0"])
    one_path = os.path.join(tmp, "batch0.safetensors")
    stio.save({"tokens": tokens[0], "targets": targets[0]}, one_path)
    logits_path = os.path.join(tmp, "logits.safetensors")
    r = subprocess.run([os.path.join(pkeep, "gpt_probe"), init_path, one_path, logits_path],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    if r.returncode != 0:
        raise Failure("the forward probe exited %d:\n%s%s" % (r.returncode, r.stdout, r.stderr))
    fwd_loss = float(r.stdout.split()[2])
    with torch.no_grad():
        ref = {}
        for dt in (torch.float32, torch.float64):
            p = {n: torch.tensor(v, dtype=dt) for n, v in init.items()}
            loss, logits = G.forward(torch, p, torch.tensor(tokens[0], dtype=torch.int64),
                                     torch.tensor(targets[0], dtype=torch.int64), NH, L)
            ref[dt] = (loss.item(), logits.double().numpy())
    check_losses("forward", [fwd_loss], [ref[torch.float32][0]])
    check_tensors(np, "forward", ["logits"], stio.load(logits_path), {"logits": ref[torch.float32][1]},
                  LOGIT_ATOL, LOGIT_RTOL, {"logits": ref[torch.float64][1]})

    # c) STEPS steps of the file's AdamW
    def adamw(ps):
        return torch.optim.AdamW(ps, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    out = os.path.join(tmp, "adamw.safetensors")
    d_losses = run_trainer(exe, tmp, ["--init", init_path, "--batch-file", batch_path, "--steps", str(STEPS),
                                      "--save", out])
    t_losses, _, t_final = G.train(torch, init, tokens, targets, NH, L, STEPS, torch.float32, adamw)
    _, _, t_final64 = G.train(torch, init, tokens, targets, NH, L, STEPS, torch.float64, adamw)
    check_losses("adamw", d_losses, t_losses)
    # the key biases: against float64 torch (there, the exact-arithmetic value: the
    # initial one decayed), with Adam's bound on how far noise can move them
    kmask = np.zeros(3 * C, dtype=bool)
    kmask[C:2 * C] = True
    loose, want = {}, dict(t_final)
    for i in range(L):
        name = "h.%d.attn.c_attn.bias" % i
        loose[name] = (kmask, KBIAS_ATOL)
        want[name] = np.where(kmask, t_final64[name], t_final[name])
    for name in loose:
        print("%-12s %-24s key part: torch float32 vs float64 %.3g (the noise the loose bound allows)"
              % ("adamw", name, float(np.max(np.abs(t_final[name] - t_final64[name])[kmask]))))
    check_tensors(np, "adamw", names, stio.load(out), want, WEIGHT_ATOL, 0.0, t_final64, loose)
    print("PASS: examples/gpt.dm matches PyTorch (%s): step-1 loss and gradients, forward logits, "
          "%d steps of AdamW" % (SETS, STEPS))


def mode_hf(np, torch, G, dmc, src_path, specs, tmp):
    import stio
    names = [n for n, _ in specs]
    init = G.make_init(torch, specs, 4321)
    tokens, targets = make_batches(np, 8765, 1)
    batch_path = os.path.join(tmp, "batch.safetensors")
    stio.save({"tokens": tokens, "targets": targets}, batch_path)
    meta = {"format": "pt"}

    # a) model.safetensors layout, with the attn.bias buffers
    hf = G.hf_checkpoint(init, T, L)
    plain = os.path.join(tmp, "model.safetensors")
    stio.save(hf, plain, metadata=meta, sort=False)
    check = stio.load(plain)
    if set(check) != set(names) | {"h.%d.attn.bias" % i for i in range(L)}:
        raise Failure("the HF-layout file holds %s" % sorted(check))
    # (`dmc run` once; the later runs use the trainer it built)
    keep = os.path.join(tmp, "build")
    exe = os.path.join(keep, "gpt")
    d_loss, d_grads = step1_check(np, torch, G, "hf", lambda a: run_dmc(dmc, src_path, tmp, ["--keep", keep] + a),
                                  tmp, init, tokens, targets, plain, batch_path)

    # c) (first: needs no prefix support) a longer context's wpe.weight
    bad = dict(hf)
    bad["wpe.weight"] = np.concatenate([init["wpe.weight"], init["wpe.weight"]])
    bad_path = os.path.join(tmp, "bad-wpe.safetensors")
    stio.save(bad, bad_path, metadata=meta, sort=False)
    run_trainer_failing(exe, tmp, ["--init", bad_path, "--batch-file", batch_path, "--steps", "1"],
                    "hf-bad-wpe", ["wpe.weight", "[%d, %d]" % (2 * T, C), "[%d, %d]" % (T, C)])

    # b) GPT2LMHeadModel.save_pretrained's keys: "transformer." before every key
    pre = G.hf_checkpoint(init, T, L, prefix="transformer.")
    pre_path = os.path.join(tmp, "lmhead.safetensors")
    stio.save(pre, pre_path, metadata=meta, sort=False)
    p_loss, p_grads = step1_check(np, torch, G, "hf-prefixed", lambda a: run_trainer(exe, tmp, a), tmp,
                                  init, tokens, targets, pre_path, batch_path)
    same = p_loss == d_loss and all(np.array_equal(p_grads[n], d_grads[n]) for n in names)
    print("%-12s loss and gradients bit-identical to the unprefixed file's: %s" % ("hf-prefixed", same))
    if not same:
        raise Failure("hf-prefixed: loss or gradients differ from those of the same weights without "
                      "the prefix")

    # c) a prefixed file with c_attn.weight in nn.Linear's [out, in] layout
    bad = dict(pre)
    key = "transformer.h.1.attn.c_attn.weight"
    bad[key] = np.ascontiguousarray(pre[key].T)
    bad_path = os.path.join(tmp, "bad-cattn.safetensors")
    stio.save(bad, bad_path, metadata=meta, sort=False)
    run_trainer_failing(exe, tmp, ["--init", bad_path, "--batch-file", batch_path, "--steps", "1"],
                    "hf-bad-cattn", ["h.1.attn.c_attn.weight", "[%d, %d]" % (3 * C, C), "[%d, %d]" % (C, 3 * C)])
    print("PASS: Hugging Face GPT-2 layout (%s): loads with and without 'transformer.', loss and gradients "
          "match PyTorch, wrong shapes are named" % SETS)


def run_checks(dmc, root, np, torch, mode):
    import gpt_torch as G

    torch.manual_seed(0)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    src_path = os.path.join(root, "examples", "gpt.dm")
    with open(src_path) as f:
        src = f.read()
    specs = G.param_specs(V, T, C, L)
    model_signature(dmc, src_path, src, specs)
    with tempfile.TemporaryDirectory(prefix="dmc-ref-gpt-") as tmp:
        (mode_train if mode == "train" else mode_hf)(np, torch, G, dmc, src_path, specs, tmp)
    return "examples/gpt.dm matches PyTorch (%s)" % mode


def main(argv):
    if len(argv) not in (3, 4) or (len(argv) == 4 and argv[3] not in ("train", "hf")):
        sys.stderr.write("usage: %s DMC SOURCE_ROOT [train|hf]\n" % argv[0])
        return 2
    mode = argv[3] if len(argv) == 4 else "train"
    return dmcrun.reference_main(argv[:3], lambda dmc, root, np, torch: run_checks(dmc, root, np, torch, mode))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
