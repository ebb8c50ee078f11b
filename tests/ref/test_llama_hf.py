#!/usr/bin/python3
"""test_llama_hf.py: examples/llama.dm against Hugging Face transformers' LlamaForCausalLM.

usage: python3 tests/ref/test_llama_hf.py DMC SOURCE_ROOT      (meson test `ref-llama-hf`)

Needs `transformers`, which Debian does not package: tests/ref/setup_hf.sh installs it
(pinned, tests/ref/hf-requirements.txt) into tests/ref/.venv-hf, a virtual environment
that reuses the system torch. Run by any Python, this script re-executes itself with
that environment's interpreter when transformers is not importable; without the
environment it prints a SKIP line saying how to make it and exits 77 (a meson skip).

For each of two tiny configs, vocab 128, hidden 64, 2 layers, 4 heads, intermediate 86,
rms_norm_eps 1e-6, rope_theta 10000, untied lm_head, no biases, float32, and
  num_key_value_heads 4 (= heads, plain multi-head attention) and
  num_key_value_heads 2 (grouped-query attention, each key/value head shared by 2 query heads):
  1. a LlamaForCausalLM(config) is made, its weights redrawn larger than a fresh model's
     (so that attention is peaked and every gradient path carries signal: linear weights
     N(0, 0.15), embeddings N(0, 1), norm weights U[0.5, 1.5)), and save_pretrained
     writes model.safetensors; `dmc run examples/llama.dm --init model.safetensors` loads
     that file unchanged (keys model.embed_tokens.weight ... lm_head.weight);
  2. batches are random token sequences of T + 1: tokens = seq[:, :T], targets =
     seq[:, 1:] (the next tokens); on the HF side the loss is computed from its logits
     with the same targets (HF's `labels` would shift inside, the same thing);
  3. step 1: the loss and every gradient (--dump-grads; parameter names map 1:1 to HF's
     named_parameters) vs HF autograd, after clip_grad_norm_(1.0) (--dump-grads writes
     them clipped; the norm here is ~3, so clipping is active and checked too);
  4. 10 steps of AdamW: the example's optimizer line is replaced (in a copy in a temporary
     directory) by `adamw(lr = 1e-3, weight_decay = 0.1, clip = 1.0)` (the example's
     warmup and cosine decay over its run are left out: they are tested elsewhere and
     would need the run length), vs torch.optim.AdamW with clip_grad_norm_(1.0): the 10
     losses and the weights after.
  5. `--predict` of the first batch's tokens: the logits vs HF's (gradients' bounds);
  6. the 10 AdamW steps again on data=2 x tensor=2 x pipeline=2 (2 micro-batches), on
     data=2 with ZeRO 3, and on tensor=2 with full recomputation (`dmc run`, threads):
     the same losses and weights, to the same bounds.
The dims are set with --set V=128,T=16,C=64,NH=4,NKV=..,F=86,L=2,B=4.

Bounds: losses 1e-5 relative; gradients 1e-5 + 1e-4 |hf|; weights 1e-5 absolute, except
the elements where torch float32 and float64 themselves end more than 2e-6 apart (a
gradient element that is rounding noise, which Adam turns into steps of up to lr of any
sign): those against float64 with Adam's bound 10.2 * lr over 10 steps (see test_gpt.py).
Both are float32 summed in different orders (and RoPE's inverse frequencies come from
exp/log in dmc, a power in HF: a few ulps apart).

Exit status: 0 pass, 1 failure, 77 skip (no transformers environment, or no torch/numpy).
"""
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
VENV_PY = os.path.join(HERE, ".venv-hf", "bin", "python")

V, T, C, NH, F, L, B = 128, 16, 64, 4, 86, 2, 4
STEPS = 10
LR, WD, CLIP = 1e-3, 0.1, 1.0
OPT_LINE = "optimizer adamw(lr = 1e-3, weight_decay = 0.1, clip = 1.0)"
LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 1e-5, 1e-4
WEIGHT_ATOL = 1e-5
NOISY_AT, NOISY_ATOL = 2e-6, 10.2 * LR
# the AdamW run again, as `dmc run` options (threads backend): 8 ranks with 2 micro-batches
# through 2 pipeline stages, ZeRO 3 over data, and full recomputation, also on a pipeline
# (each decoder layer recomputed on its own stage: the whole model was one segment, and a
# pipeline with recomputation did not compile)
MESH_RUNS = [("d2t2p2", ["--mesh", "data=2,tensor=2,pipeline=2", "--microbatches", "2"]),
             ("zero3", ["--mesh", "data=2", "--zero", "3"]),
             ("recompute", ["--mesh", "tensor=2", "--recompute", "full"]),
             ("recompute-pipeline", ["--mesh", "pipeline=2", "--microbatches", "2", "--recompute", "selective"])]


def have_transformers():
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


def hf_model(torch, nkv, seed):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                      num_attention_heads=NH, num_key_value_heads=nkv, max_position_embeddings=T,
                      rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                      attention_bias=False, hidden_act="silu", attn_implementation="eager")
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.15)
    return m


def hf_loss(torch, m, tokens, targets):
    logits = m(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def run_case(np, torch, dmcrun, stio, check_tensors, dmc, src, nkv, tmp):
    from dmcrun import Failure
    sets = "V=%d,T=%d,C=%d,NH=%d,NKV=%d,F=%d,L=%d,B=%d" % (V, T, C, NH, nkv, F, L, B)
    what = "nkv%d" % nkv
    m = hf_model(torch, nkv, 1000 + nkv)
    mdir = os.path.join(tmp, "hf-" + what)
    m.save_pretrained(mdir, safe_serialization=True)
    init_path = os.path.join(mdir, "model.safetensors")
    init = stio.load(init_path)
    names = [n for n, _ in m.named_parameters()]
    if sorted(init) != sorted(names):
        raise Failure("%s: save_pretrained wrote %s, the model has %s" % (what, sorted(init), sorted(names)))

    rng = np.random.default_rng(77 + nkv)
    seq = rng.integers(0, V, size=(STEPS, B, T + 1)).astype(np.int32)
    tokens, targets = np.ascontiguousarray(seq[:, :, :T]), np.ascontiguousarray(seq[:, :, 1:])
    batch_path = os.path.join(tmp, what + "-batches.safetensors")
    stio.save({"tokens": tokens, "targets": targets}, batch_path)

    keep = os.path.join(tmp, "build-" + what)
    grads_path = os.path.join(tmp, what + "-grads.safetensors")
    d_loss = dmcrun.run_dmc(dmc, src, tmp, ["--set", sets, "--keep", keep, "--init", init_path,
                                            "--batch-file", batch_path, "--steps", "1",
                                            "--dump-grads", grads_path], timeout=300)
    tt = [torch.tensor(tokens[s], dtype=torch.int64) for s in range(STEPS)]
    tg = [torch.tensor(targets[s], dtype=torch.int64) for s in range(STEPS)]
    m.zero_grad()
    loss = hf_loss(torch, m, tt[0], tg[0])
    loss.backward()
    # --dump-grads writes the gradients clipped (docs/language.md), as p.grad after the call
    norm = float(torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP))
    print("%-12s gradient norm before clipping %.4g (clip %.1f)" % (what, norm, CLIP))
    dmcrun.check_losses(what + "-step1", d_loss, [loss.item()], LOSS_RTOL)
    hf_grads = {n: p.grad.detach().double().numpy() for n, p in m.named_parameters()}
    check_tensors(np, what + "-grads", names, stio.load(grads_path), hf_grads, GRAD_ATOL, GRAD_RTOL)

    # --predict: the logits of the first batch's tokens from the same file
    exe = os.path.join(keep, os.path.splitext(os.path.basename(src))[0])
    tokens_path = os.path.join(tmp, what + "-tokens.safetensors")
    stio.save({"tokens": tokens[0]}, tokens_path)
    pred_path = os.path.join(tmp, what + "-predict.safetensors")
    dmcrun.step_losses([exe, "--quiet", "--init", init_path, "--predict", "--batch-file", tokens_path,
                        "--out", pred_path], tmp, timeout=300)
    with torch.no_grad():
        hf_logits = m(input_ids=tt[0]).logits.double().numpy()
    check_tensors(np, what + "-predict", ["logits"], stio.load(pred_path), {"logits": hf_logits}, GRAD_ATOL, GRAD_RTOL)

    # 10 steps of AdamW with clipping, from the same file
    out = os.path.join(tmp, what + "-adamw.safetensors")
    d_losses = dmcrun.step_losses([exe, "--quiet", "--init", init_path, "--batch-file", batch_path,
                                   "--steps", str(STEPS), "--save", out], tmp, timeout=300)
    def adamw_run(dtype):
        m2 = hf_model(torch, nkv, 1000 + nkv).to(dtype)
        with torch.no_grad():
            for n, p in m2.named_parameters():
                p.copy_(torch.tensor(init[n]))
        opt = torch.optim.AdamW(m2.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
        losses = []
        for s in range(STEPS):
            opt.zero_grad()
            loss = hf_loss(torch, m2, tt[s], tg[s])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m2.parameters(), CLIP)
            opt.step()
            losses.append(loss.item())
        return losses, {n: p.detach().double().numpy() for n, p in m2.named_parameters()}
    t_losses, final = adamw_run(torch.float32)
    _, final64 = adamw_run(torch.float64)
    dmcrun.check_losses(what + "-adamw", d_losses, t_losses, LOSS_RTOL)
    # elements where torch float32 and float64 themselves differ by more than NOISY_AT after
    # the 10 steps: Adam turned rounding noise in a near-zero gradient into steps (m / sqrt(v)
    # has any sign for noise); held against float64 with Adam's bound, as test_gpt.py's key biases
    loose, want = {}, dict(final)
    for n in names:
        mask = np.abs(final[n] - final64[n]) > NOISY_AT
        if mask.any():
            loose[n] = (mask, NOISY_ATOL)
            want[n] = np.where(mask, final64[n], final[n])
            print("%-12s %-24s %d noisy element(s): torch f32 vs f64 up to %.3g"
                  % (what + "-adamw", n, int(mask.sum()), float(np.abs(final[n] - final64[n]).max())))
    check_tensors(np, what + "-adamw", names, stio.load(out), want, WEIGHT_ATOL, 0.0, final64, loose)

    # the same 10 steps on meshes, with ZeRO 3 and with recomputation: the same file in,
    # HF's losses and weights out (each run sums in its own order: float noise apart)
    for label, args in MESH_RUNS:
        out = os.path.join(tmp, "%s-%s.safetensors" % (what, label))
        d_losses = dmcrun.run_dmc(dmc, src, tmp, ["--set", sets, "--init", init_path, "--batch-file", batch_path,
                                                  "--steps", str(STEPS), "--save", out] + args, timeout=600)
        dmcrun.check_losses("%s-%s" % (what, label), d_losses, t_losses, LOSS_RTOL)
        check_tensors(np, "%s-%s" % (what, label), names, stio.load(out), want, WEIGHT_ATOL, 0.0, final64, loose)


def run_checks(dmc, root, np, torch):
    import dmcrun
    import stio
    from test_gpt import check_tensors
    from dmcrun import Failure
    torch.set_num_threads(min(2, torch.get_num_threads()))
    with open(os.path.join(root, "examples", "llama.dm")) as f:
        src_text = f.read()
    lines = re.findall(r"^optimizer .*$", src_text, re.M)
    if len(lines) != 1:
        raise Failure("examples/llama.dm has %d optimizer lines, expected 1" % len(lines))
    with tempfile.TemporaryDirectory(prefix="dmc-ref-llama-hf-") as tmp:
        src = os.path.join(tmp, "llama.dm")
        with open(src, "w") as f:
            f.write(src_text.replace(lines[0], OPT_LINE))
        for nkv in (NH, 2):
            run_case(np, torch, dmcrun, stio, check_tensors, dmc, src, nkv, tmp)
    return ("examples/llama.dm matches transformers LlamaForCausalLM (num_key_value_heads %d and 2): "
            "step-1 loss and gradients, --predict logits, %d AdamW steps, serial and %s" % (NH, STEPS, ", ".join(l for l, _ in MESH_RUNS)))


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: %s DMC SOURCE_ROOT\n" % argv[0])
        return 2
    if not have_transformers():
        if os.path.exists(VENV_PY) and not os.environ.get("DMC_LLAMA_HF_REEXEC"):
            os.environ["DMC_LLAMA_HF_REEXEC"] = "1"
            os.execv(VENV_PY, [VENV_PY, os.path.abspath(__file__)] + argv[1:])
        print("SKIP: transformers is not installed; make its environment with `sh tests/ref/setup_hf.sh` "
              "(PyPI, about 30 MB; reuses the system torch), then run this test again")
        return 77
    import dmcrun
    return dmcrun.reference_main(argv, run_checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
