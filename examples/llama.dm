# llama.dm: LLaMA (Touvron et al., 2023): RMSNorm before each sublayer, rotary position
# embeddings (RoPE) on queries and keys, a SwiGLU MLP, no biases. Parameter names and
# layouts follow the Hugging Face LlamaForCausalLM checkpoint (model.embed_tokens.weight,
# model.layers.N.self_attn.q_proj.weight stored [out, in] as nn.Linear does, ...,
# model.norm.weight, lm_head.weight). Grouped-query attention: NKV key/value heads
# (num_key_value_heads), each shared by NH / NKV query heads; NKV = NH is plain
# multi-head attention. The defaults are a small config; any other is one --set away:
#   dmc --explain examples/llama.dm
#   dmc run examples/llama.dm --set V=256,T=64,C=128,NH=4,F=344,L=4,B=16 \
#       --data text:/usr/share/games/fortunes/cookie --steps 2000
dim B = 8          # batch
dim T = 256        # context length
dim V = 32000      # vocabulary
dim C = 512        # hidden_size
dim NH = 8         # num_attention_heads
dim NKV = NH       # num_key_value_heads (NH divides by it)
dim F = 1376       # intermediate_size
dim L = 8          # num_hidden_layers
dim THETA = 10000  # rope_theta

# `--mesh tensor=N` splits attention by heads and the MLP by its hidden units (Megatron-LM)
# and the vocabulary; `--mesh pipeline=N` cuts the layers into stages. NH, F and V must
# divide by tensor; so should NKV, for key/value heads split like the query heads' (an NKV
# that does not still trains the same, its keys and values moved by an alltoall, where
# NKV x C/NH divides by tensor: k_proj's rows are split).
mesh(data = 1, tensor = 1, pipeline = 1)

block rmsnorm[C](x) {
    param weight : f32[C] = ones
    return x * rsqrt(mean(x * x, -1, keepdim = true) + 1e-6) * weight
}

# nn.Linear without a bias, its weight [out, in]: y = x @ weight^T (the transpose folded
# into the product). Column-parallel: each rank holds a block of the output rows.
block column[IN, OUT](x) {
    param weight : f32[OUT@tensor, IN] = normal(0, 0.02)
    return x @ transpose(weight)
}

# row-parallel: each rank holds a block of the input columns, the product is a pending
# sum over tensor (one allreduce)
block row[IN, OUT](x) {
    param weight : f32[OUT, IN@tensor] = normal(0, 0.02)
    return x @ transpose(weight)
}

# RoPE on x [B, NH, T, HD] as Hugging Face's apply_rotary_pos_emb: position t's pair
# (i, i + HD/2) rotated by the angle t / THETA^(2i / HD). The table is computed from
# constants (it depends on no input or parameter, so it has no gradient).
block rotary[HD](x) {
    inv_freq = exp(arange(0, HD, 2) / HD * -log(THETA))     # 1 / THETA^(2i / HD)
    freqs = reshape(arange(T), [T, 1]) * inv_freq            # outer(positions, inv_freq)
    emb = concat(freqs, freqs, dim = -1)                     # [T, HD]
    rotated = concat(-slice(x, -1, HD / 2, HD), slice(x, -1, 0, HD / 2), dim = -1)   # rotate_half
    return x * cos(emb) + rotated * sin(emb)
}

# Hugging Face's repeat_kv: x [B, NKV, T, HD] -> [B, NKV * R, T, HD], key/value head g
# serving query heads g * R .. g * R + R - 1: expanded along a new dim of R (the gradient
# sums over the repeats), then the group and repeat dims merge. R = 1 leaves x as it is.
block repeat_kv[NKV, R, HD](x) {
    return reshape(expand(reshape(x, [B, NKV, 1, T, HD]), [B, NKV, R, T, HD]), [B, NKV * R, T, HD])
}

# causal self-attention, heads split from and merged back into C
block attention[C, NH, NKV](x) {
    dim HD = C / NH                                                  # head_dim
    layer q_proj = column[C, C]
    layer k_proj = column[C, NKV * HD]
    layer v_proj = column[C, NKV * HD]
    layer o_proj = row[C, C]
    layer rope = rotary[HD]
    layer kv_heads = repeat_kv[NKV, NH / NKV, HD]
    q = rope(permute(reshape(q_proj(x), [B, T, NH, HD]), [0, 2, 1, 3]))
    k = kv_heads(rope(permute(reshape(k_proj(x), [B, T, NKV, HD]), [0, 2, 1, 3])))
    v = kv_heads(permute(reshape(v_proj(x), [B, T, NKV, HD]), [0, 2, 1, 3]))
    att = softmax(causal_mask(q @ transpose(k) / sqrt(HD)), -1)     # [B, NH, T, T]
    return o_proj(reshape(permute(att @ v, [0, 2, 1, 3]), [B, T, C]))
}

block mlp[C, F](x) {
    layer gate_proj = column[C, F]
    layer up_proj = column[C, F]
    layer down_proj = row[F, C]
    return down_proj(silu(gate_proj(x)) * up_proj(x))
}

block decoder_layer[C, NH, NKV, F](x) {
    layer input_layernorm = rmsnorm[C]
    layer self_attn = attention[C, NH, NKV]
    layer post_attention_layernorm = rmsnorm[C]
    layer mlp = mlp[C, F]
    h = x + self_attn(input_layernorm(x))                            # residual adds
    return h + mlp(post_attention_layernorm(h))
}

# the vocabulary splits over tensor (each rank looks up the rows it holds)
block embedding[N, C](ids) {
    param weight : f32[N@tensor, C] = normal(0, 0.02)
    return embed(weight, ids)
}

block llama[V, C, NH, NKV, F, L](tokens) {
    layer embed_tokens = embedding[V, C]
    layer layers = repeat L decoder_layer[C, NH, NKV, F]
    layer norm = rmsnorm[C]
    return norm(layers(embed_tokens(tokens)))
}

input tokens  : i32[B@data, T]
input targets : i32[B@data, T]     # tokens shifted by one

layer model = llama[V, C, NH, NKV, F, L]
layer lm_head = column[C, V]       # untied from the embedding
logits = lm_head(model(tokens))    # [B, T, V], split over the vocabulary
loss = cross_entropy(logits, targets)

output logits
minimize loss
optimizer adamw(lr = 3e-4, weight_decay = 0.1, warmup = 100, decay = cosine, min_lr = 3e-5, clip = 1.0)
