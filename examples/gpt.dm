# gpt.dm: GPT-2 (Radford et al., 2019). Parameter names and shapes follow the Hugging Face
# GPT-2 checkpoint, so its model.safetensors loads with `--init --set V=50257`. The sizes
# are named as in llm.c; the defaults are GPT-2 124M, and any other config is one --set away:
#   dmc --explain examples/gpt.dm
#   dmc run examples/gpt.dm --set V=256,T=64,C=128,NH=4,L=4,B=16 \
#       --data text:/usr/share/games/fortunes/cookie --steps 2000 --sample 400

dim B = 4        # batch
dim T = 1024     # context length
dim V = 50304    # vocabulary: GPT-2's 50257 padded to a multiple of 128 (llm.c, nanoGPT)
dim C = 768      # width (channels)
dim NH = 12      # attention heads
dim L = 12       # layers

# One device by default. `--mesh data=N` splits every batch over N ranks; `--mesh tensor=N`
# splits attention by heads and the MLP by its hidden units (Megatron-LM: one allreduce per
# block forward, one backward) and the vocabulary; `--mesh pipeline=N` cuts the blocks
# into N stages (dmc --explain shows where). NH, 4 * C and V must divide by tensor.
mesh(data = 1, tensor = 1, pipeline = 1)

# Hugging Face's Conv1D: weight stored [in, out], y = x @ weight + bias; each rank holds a
# block of the output columns (no communication)
block linear[IN, OUT](x) {
    param weight : f32[IN, OUT@tensor] = normal(0, 0.02)
    param bias   : f32[OUT@tensor] = zeros
    return x @ weight + bias
}

# the projections back into the residual stream start smaller, as in GPT-2; each rank holds
# a block of the input rows, so the product is a pending sum over `tensor` (one allreduce)
block projection[IN, OUT](x) {
    param weight : f32[IN@tensor, OUT] = normal(0, 0.02 / sqrt(2 * L))
    param bias   : f32[OUT] = zeros
    return x @ weight + bias
}

block norm[C](x) {
    param weight : f32[C] = ones
    param bias   : f32[C] = zeros
    return layernorm(x, weight, bias, eps = 1e-5)
}

# part P (0: q, 1: k, 2: v) of a fused projection: x @ weight[:, P, :] + bias[P, :]
block part[C, P](x, weight, bias) {
    return x @ reshape(slice(weight, 1, P, P + 1), [C, C]) + reshape(slice(bias, 0, P, P + 1), [C])
}

# Hugging Face's fused q | k | v projection, stored [C, 3C] as in the checkpoint and computed
# as [C, 3, C] (the same elements), so that q, k and v each split by heads over `tensor`.
# A call gives q; part[C, 1] and part[C, 2] of its parameters give k and v.
block fused_qkv[C](x) {
    param weight : f32[C, 3, C@tensor] as [C, 3 * C] = normal(0, 0.02)
    param bias   : f32[3, C@tensor] as [3 * C] = zeros
    layer q = part[C, 0]
    return q(x, weight, bias)
}

# causal self-attention, heads split from and merged back into C
block attention[C, NH](x) {
    dim HS = C / NH                                                 # head size
    layer c_attn = fused_qkv[C]
    layer k_part = part[C, 1]
    layer v_part = part[C, 2]
    layer c_proj = projection[C, C]
    q = transpose(reshape(c_attn(x), [B, T, NH, HS]), T, NH)                          # [B, NH, T, HS]
    k = transpose(reshape(k_part(x, c_attn.weight, c_attn.bias), [B, T, NH, HS]), T, NH)
    v = transpose(reshape(v_part(x, c_attn.weight, c_attn.bias), [B, T, NH, HS]), T, NH)
    att = softmax(causal_mask(q @ transpose(k) / sqrt(HS)), -1)    # [B, NH, T, T]
    y = reshape(transpose(att @ v, NH, T), [B, T, C])               # heads merged
    return c_proj(y)
}

block feed_forward[C](x) {
    layer c_fc = linear[C, 4 * C]
    layer c_proj = projection[4 * C, C]
    return c_proj(gelu(c_fc(x)))
}

block transformer_block[C, NH](x) {
    layer ln_1 = norm[C]
    layer attn = attention[C, NH]
    layer ln_2 = norm[C]
    layer mlp = feed_forward[C]
    x_attn = x + attn(ln_1(x))                                      # residual adds
    return x_attn + mlp(ln_2(x_attn))
}

# the vocabulary splits over `tensor` (Megatron-LM's vocabulary-parallel embedding: a rank
# looks up the rows it holds, one allreduce sums them), and so do the tied head's logits,
# which cross-entropy takes split; V must divide by tensor (hence 50304)
block token_embedding[N, C](ids) {
    param weight : f32[N@tensor, C] = normal(0, 0.02)
    return embed(weight, ids)
}

# position t's vector is row t of the table, the same for every sequence of the batch
block position_embedding[N, C](x) {
    param weight : f32[N, C] = normal(0, 0.01)
    return x + weight
}

input tokens  : i32[B@data, T]
input targets : i32[B@data, T]     # tokens shifted by one

layer wte = token_embedding[V, C]
layer wpe = position_embedding[T, C]
layer h = repeat L transformer_block[C, NH]
layer ln_f = norm[C]

x = wpe(wte(tokens))                                # [B, T, C]
logits = ln_f(h(x)) @ transpose(wte.weight)         # the head is tied to the token embedding: [B, T, V]
loss = cross_entropy(logits, targets)

output logits
minimize loss
optimizer adamw(lr = 1e-3, weight_decay = 0.01)
