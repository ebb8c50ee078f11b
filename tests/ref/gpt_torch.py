"""gpt_torch.py: the PyTorch mirror of examples/gpt.dm, for tests/ref/test_gpt.py.

GPT-2 written out with plain tensor ops (no nn.Module, no `transformers`, which Debian
does not package), parameters in a dict keyed by the .dm's dotted names, weights stored
[in, out] as in Hugging Face's Conv1D (y = x @ W + b). Every function takes the torch
module as an argument so that importing this file never needs torch (the test exits 77,
a skip, where torch is missing).
"""

import numpy as np

LN_EPS = 1e-5


def param_specs(V, T, C, L):
    """[(name, shape)] in the .dm's declaration order (the order of --explain)."""
    specs = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(L):
        p = "h.%d." % i
        specs += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                  (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                  (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                  (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                  (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                  (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    specs += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return specs


def make_init(torch, specs, seed):
    """Random float32 initial weights (numpy), chosen so that every gradient path
    carries signal: layernorm weights uniform in [0.5, 1.5) and biases N(0, 0.1) (not
    the ones/zeros of a fresh model), every linear bias N(0, 0.1), and weights large
    enough that attention is peaked rather than uniform (q.k/sqrt(HS) has a std of ~3
    here) and GELU works in its curved region."""
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64) * std

    out = {}
    for name, shape in specs:
        leaf = name.rsplit(".", 2)[-2:]
        if name in ("wte.weight", "wpe.weight"):
            t = normal(shape, 0.3)
        elif leaf[0].startswith("ln") and leaf[1] == "weight":
            t = 0.5 + torch.rand(shape, generator=g, dtype=torch.float64)
        elif leaf[1] == "bias":
            t = normal(shape, 0.1)
        elif leaf[0] == "c_attn":
            t = normal(shape, 0.3)
        elif leaf[0] == "c_fc":
            t = normal(shape, 0.2)
        else:  # the c_proj's back into the residual stream
            t = normal(shape, 0.1)
        out[name] = t.numpy().astype(np.float32)
    return out


def explicit_attention(torch, q, k, v):
    """Causal attention of q, k, v [B, NH, T, HS], written out in f32."""
    T, HS = q.shape[-2], q.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = (q @ k.transpose(-1, -2)) / (HS ** 0.5)
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return att @ v


def forward(torch, p, tokens, targets, NH, L, product=None, attention=None):
    """Loss (mean cross-entropy over B*T) and logits [B, T, V] of gpt.dm. product(a, b):
    the weights' products (the linears and the head), a @ b by default; attention(torch,
    q, k, v): the causal attention, explicit_attention by default (test_bf16.py passes
    one with dmc's fused attention's bf16 roundings)."""
    F = torch.nn.functional
    product = product or (lambda a, b: a @ b)
    attention = attention or explicit_attention
    B, T = tokens.shape
    C = p["wte.weight"].shape[1]
    HS = C // NH

    def ln(x, pre):
        return F.layer_norm(x, (C,), p[pre + ".weight"], p[pre + ".bias"], eps=LN_EPS)

    def linear(x, pre):
        return product(x, p[pre + ".weight"]) + p[pre + ".bias"]

    x = p["wte.weight"][tokens] + p["wpe.weight"]
    for i in range(L):
        pre = "h.%d." % i
        qkv = linear(ln(x, pre + "ln_1"), pre + "attn.c_attn")
        q, k, v = (t.reshape(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=-1))
        y = attention(torch, q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, pre + "attn.c_proj")
        h = F.gelu(linear(ln(x, pre + "ln_2"), pre + "mlp.c_fc"), approximate="tanh")
        x = x + linear(h, pre + "mlp.c_proj")
    logits = product(ln(x, "ln_f"), p["wte.weight"].t())
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
    return loss, logits


def train(torch, init, tokens, targets, NH, L, steps, dtype, make_opt=None, product=None, attention=None):
    """Trains from init (numpy) on batches tokens/targets [S, B, T] (step i uses slice
    i mod S); returns (losses, gradients of step 1, final params), numpy float64.
    product, attention: forward's."""
    names = list(init)
    p = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in init.items()}
    opt = make_opt([p[n] for n in names]) if make_opt else None
    losses, grads1 = [], None
    for s in range(steps):
        for t in p.values():
            t.grad = None
        tok = torch.tensor(tokens[s % len(tokens)], dtype=torch.int64)
        tgt = torch.tensor(targets[s % len(targets)], dtype=torch.int64)
        loss, _ = forward(torch, p, tok, tgt, NH, L, product, attention)
        loss.backward()
        losses.append(loss.item())
        if grads1 is None:
            grads1 = {n: p[n].grad.detach().double().numpy().copy() for n in names}
        if opt:
            opt.step()
    return losses, grads1, {n: t.detach().double().numpy() for n, t in p.items()}


def hf_checkpoint(init, T, L, prefix=""):
    """The tensors of a Hugging Face GPT-2 model.safetensors for these weights: the
    same parameter names (HF's GPT2Model uses exactly gpt.dm's), plus the causal-mask
    buffers h.N.attn.bias, f32 [1, 1, T, T] lower-triangular ones (n_positions = T
    here), which older transformers versions store and which are not parameters.
    prefix "transformer." gives the keys GPT2LMHeadModel.save_pretrained writes (the
    tied lm_head.weight is not stored)."""
    out = {prefix + n: v for n, v in init.items()}
    mask = np.tril(np.ones((T, T), dtype=np.float32)).reshape(1, 1, T, T)
    for i in range(L):
        out[prefix + "h.%d.attn.bias" % i] = mask.copy()
    return out

