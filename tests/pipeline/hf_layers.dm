# hf_layers.dm: a decoder laid out as Hugging Face's LLaMA names it (model.embed_tokens,
# model.layers.N.mlp.down_proj, model.norm, lm_head): the layer stack is a layer of the
# model's block, so its members' values are named model.layers.N.* (tests/pipeline/
# test_layer_names.py: pipeline stages cut between them, cuts by layer name).
dim B = 8
dim T = 16
dim C = 64
dim F = 172
dim V = 128
dim L = 4

mesh(pipeline = 2)
schedule 1f1b(microbatches = 4)

block rmsnorm[C](x) {
    param weight : f32[C] = ones
    return x * rsqrt(mean(x * x, -1, keepdim = true) + 1e-6) * weight
}

block mlp[C, F](x) {
    param gate_proj : f32[C, F] = normal(0, 0.02)
    param up_proj : f32[C, F] = normal(0, 0.02)
    param down_proj : f32[F, C] = normal(0, 0.02)
    return (silu(x @ gate_proj) * (x @ up_proj)) @ down_proj
}

block decoder_layer[C, F](x) {
    layer post_attention_layernorm = rmsnorm[C]
    layer mlp = mlp[C, F]
    return x + mlp(post_attention_layernorm(x))
}

block llama[V, C, F, L](tokens) {
    param embed_tokens : f32[V, C] = normal(0, 0.02)
    layer layers = repeat L decoder_layer[C, F]
    layer norm = rmsnorm[C]
    return norm(layers(embed(embed_tokens, tokens)))
}

input tokens : i32[B, T]
input targets : i32[B, T]
layer model = llama[V, C, F, L]
param lm_head : f32[C, V] = normal(0, 0.02)
logits = model(tokens) @ lm_head
loss = cross_entropy(logits, targets)

minimize loss
optimizer adamw(lr = 1e-3)
