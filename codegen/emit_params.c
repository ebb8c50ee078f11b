/* emit_params.c: initial parameters (each from its own random stream), and the moves of
 * parameters between a rank's shard and the whole tensor (the mesh's tables and block
 * moves; in a separate memory, copies through host memory) that initialisation, weights
 * files and tools use. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

/* A host buffer `host` of the rank's block's n elements (cg_block_into_shard). */
/* `release`: statements freeing what the function holds already ("" for nothing), run
 * before it returns for want of memory. */
static void emit_host_block(emitter *E, const char *release) {
    cg_writer *w = &E->w;
    cg_line(w, "int64_t n = 1;");
    cg_line(w, "for (int d = 0; d < param_shapes[p][0]; d++) n *= block[d];");
    cg_line(w, "float *host = (float *)dmrt_alloc((size_t)n * sizeof(float));");
    if (*release) cg_line(w, "if (!host) { %sreturn DMRT_ERR_NOMEM; }", release);
    else cg_line(w, "if (!host) return DMRT_ERR_NOMEM;");
}

static int is_split(const ir_type *t) {
    for (int d = 0; d < t->rank; d++)
        if (t->split[d] != IR_REPLICATED) return 1;
    return 0;
}

void emit_init(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* Initial parameters: each from its own random stream, so that adding a parameter");
    cg_line(w, " * leaves the others' values unchanged.%s */",
            E->partitioned ? " A split parameter is drawn whole and the rank keeps its\n * block, so every mesh starts from the serial program's values" : "");
    cg_line(w, "static int init_params(struct_ctx *ctx, uint64_t seed) {");
    w->indent++;
    cg_line(w, "dmrt_rng rng;");
    if (g->n_params == 0) cg_line(w, "(void)ctx; (void)seed; (void)rng;");
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *v = V(E, g->params[p]);
        /* a split parameter (ZeRO 3's in shares too), or any in a separate memory, is drawn
         * whole in host memory first */
        const dm_zero_bucket *zb = zero_bucket_of(E, p);
        int narrow = quant_narrow_slot(E, p); /* --quantize: drawn in f32, kept narrow only */
        int split = is_split(&v->type) || (zb && zb->param_at >= 0);
        int staged = split || E->dialect->separate_memory || narrow >= 0;
        long long n = (long long)ir_numel(&v->type), off = (long long)E->plan->offset[v->id];
        /* pipeline stages hold their own parameters: each at its stage's offset */
        int by_stage = E->plan->stages > 1;
        char a[64], b[64], dst[96], at[64];
        if (by_stage) snprintf(at, sizeof at, "ctx->param_offsets[%d]", p);
        else snprintf(at, sizeof at, "%lld", off);
        if (staged) snprintf(dst, sizeof dst, "whole");
        else snprintf(dst, sizeof dst, "ctx->params + %s", at);
        cg_line(w, "/* %s */", v->name);
        if (by_stage) {
            if (zb && zb->param_at >= 0)
                cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == %d) { /* held by this rank's stage */", rank_of(E, v->stage));
            else cg_line(w, "if (ctx->param_offsets[%d] >= 0) { /* held by this rank's stage */", p);
            w->indent++;
        }
        cg_line(w, "dmrt_rng_init(&rng, seed, %d);", p);
        if (staged) {
            cg_line(w, "{");
            w->indent++;
            cg_line(w, "float *whole = (float *)dmrt_alloc(%lld * sizeof(float));", n);
            cg_line(w, "if (!whole) return DMRT_ERR_NOMEM;");
        }
        switch (v->init.kind) {
        case INIT_ZEROS: cg_line(w, "dmrt_fill_const(%s, %lld, 0.0f);", dst, n); break;
        case INIT_ONES: cg_line(w, "dmrt_fill_const(%s, %lld, 1.0f);", dst, n); break;
        case INIT_NORMAL:
            cg_float_literal(v->init.a, a, sizeof a);
            cg_float_literal(v->init.b, b, sizeof b);
            cg_line(w, "dmrt_fill_normal(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        case INIT_UNIFORM:
            cg_float_literal(v->init.a, a, sizeof a);
            cg_float_literal(v->init.b, b, sizeof b);
            cg_line(w, "dmrt_fill_uniform(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        case INIT_XAVIER: {
            /* glorot uniform: bound sqrt(6 / (fan_in + fan_out)), fans of the last two dims
             * (of the stored shape, the one a checkpoint's author saw) */
            ir_type stored = v->type;
            if (v->stored_rank) {
                stored.rank = v->stored_rank;
                for (int d = 0; d < stored.rank; d++) stored.shape[d] = v->stored_shape[d];
            }
            const ir_type *t = &stored;
            double rf = 1, fan_in, fan_out;
            for (int d = 0; d + 2 < t->rank; d++) rf *= (double)t->shape[d];
            fan_in = t->rank >= 2 ? (double)t->shape[t->rank - 2] * rf : (double)t->shape[0];
            fan_out = t->rank >= 2 ? (double)t->shape[t->rank - 1] * rf : (double)t->shape[0];
            double bound = sqrt(6.0 / (fan_in + fan_out));
            cg_float_literal(-bound, a, sizeof a);
            cg_float_literal(bound, b, sizeof b);
            cg_line(w, "dmrt_fill_uniform(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        }
        }
        if (narrow >= 0) {
            cg_line(w, "dmrt_quantize_weight(&ctx->quant[%d], whole);", narrow);
            cg_line(w, "dmrt_free(whole);");
        } else if (split) {
            cg_line(w, "int status = scatter_param(ctx, %d, whole);", p);
            cg_line(w, "dmrt_free(whole);");
            cg_line(w, "if (status != DMRT_OK) return status;");
        } else if (staged) {
            char to[96];
            snprintf(to, sizeof to, "ctx->params + %s", at);
            char bytes[64];
            snprintf(bytes, sizeof bytes, "%lld * sizeof(float)", n);
            E->dialect->copy(w, to, "whole", bytes, CG_HOST_TO_DEVICE, "{ dmrt_free(whole); return device_failed(ctx); }");
            cg_line(w, "dmrt_free(whole);");
        }
        if (staged) {
            w->indent--;
            cg_line(w, "}");
        }
        if (by_stage) {
            w->indent--;
            cg_line(w, "}");
        }
    }
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* ZeRO 3: the table of the parameters held in shares (passes/zero.c). */
static void emit_zero_params(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* ZeRO 3: where each parameter is, in shares over an axis: {axis, share, this rank's share");
    cg_line(w, " * in ctx->params, the parameter's place in the range, the range}; axis -1: not in shares. */");
    cg_line(w, "static const int64_t zero_params[%d][5] = {", g->n_params);
    for (int p = 0; p < g->n_params; p++) {
        const dm_zero_bucket *b = zero_bucket_of(E, p);
        if (!b || b->param_at < 0)
            cg_line(w, "    {-1, 0, 0, 0, 0}, /* %s */", V(E, g->params[p])->name);
        else
            cg_line(w, "    {%d, %lld, %lld, %lld, %lld}, /* %s */", b->axis, (long long)b->share, (long long)b->param_at,
                    (long long)E->zero->range_at[p], (long long)b->span, V(E, g->params[p])->name);
    }
    cg_line(w, "};");
}

/* The mesh, the split of every parameter and gradient, each parameter's stage and shape,
 * and rank_block: the block of a parameter a rank holds. */
static void emit_mesh_tables(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int n_axes = g->n_axes;
    cg_line(w, "/* The mesh this code was compiled for: %lld ranks, row-major (the last axis varies fastest). */",
            (long long)ir_mesh_ranks(g));
    cg_line(w, "static const char *const mesh_axis_names[%d] = {", n_axes);
    for (int a = 0; a < n_axes; a++) cg_line(w, "    \"%s\",", g->axes[a].name);
    cg_line(w, "};");
    cg_line(w, "static const int64_t mesh_axis_sizes[%d] = {", n_axes);
    for (int a = 0; a < n_axes; a++) cg_line(w, "    %lld,", (long long)g->axes[a].size);
    cg_line(w, "};");
    for (int grad = 0; grad < 2; grad++) {
        if (grad && !g->grads) break;
        cg_line(w, "/* The mesh axis splitting each dim of each %s (-1: whole on every rank). */", grad ? "gradient" : "parameter");
        cg_line(w, "static const int8_t %s_split[%d][%d] = {", grad ? "grad" : "param", g->n_params ? g->n_params : 1, IR_MAX_RANK);
        for (int p = 0; p < g->n_params; p++) {
            const ir_type *t = &V(E, grad ? g->grads[p] : g->params[p])->type;
            char row[128] = "";
            size_t n = 0;
            for (int d = 0; d < IR_MAX_RANK; d++) {
                int k = snprintf(row + n, sizeof row - n, "%s%d", d ? ", " : "", d < t->rank ? t->split[d] : -1);
                if (k > 0) n += (size_t)k;
            }
            cg_line(w, "    {%s}, /* %s */", row, V(E, g->params[p])->name);
        }
        if (!g->n_params) cg_line(w, "    {0},");
        cg_line(w, "};");
    }
    if (E->pipe_axis >= 0) {
        cg_line(w, "/* The mesh axis of the pipeline's stages, and the stage holding each parameter%s. */",
                E->chunks > 1 ? " (its ranks'\n * pipeline coordinate: the stage mod the axis's size)" : "");
        cg_line(w, "#define PIPELINE_AXIS %d", E->pipe_axis);
        cg_line(w, "static const int param_stage[%d] = {", g->n_params ? g->n_params : 1);
        for (int p = 0; p < g->n_params; p++)
            cg_line(w, "    %d, /* %s */", rank_of(E, V(E, g->params[p])->stage), V(E, g->params[p])->name);
        if (!g->n_params) cg_line(w, "    0,");
        cg_line(w, "};");
    }
    cg_line(w, "/* Each parameter's shape in the program (its stored shape may merge dims): rank, dims. */");
    cg_line(w, "static const int64_t param_shapes[%d][%d] = {", g->n_params ? g->n_params : 1, IR_MAX_RANK + 1);
    for (int p = 0; p < g->n_params; p++) {
        const ir_type *t = &V(E, g->params[p])->type;
        char row[256];
        size_t n = (size_t)snprintf(row, sizeof row, "%d", t->rank);
        for (int d = 0; d < t->rank && n < sizeof row; d++) n += (size_t)snprintf(row + n, sizeof row - n, ", %lld", (long long)t->shape[d]);
        cg_line(w, "    {%s},", row);
    }
    if (!g->n_params) cg_line(w, "    {0},");
    cg_line(w, "};");
    cg_blank(w);
    cg_line(w, "/* The block of parameter p (or its gradient, split as given) that this rank holds. */");
    cg_line(w, "static void rank_block(const struct_ctx *ctx, int p, const int8_t *split, int64_t *start, int64_t *block) {");
    cg_line(w, "    const int64_t *shape = param_shapes[p] + 1;");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) {");
    cg_line(w, "        block[d] = split[d] < 0 ? shape[d] : shape[d] / mesh_axis_sizes[split[d]];");
    cg_line(w, "        start[d] = split[d] < 0 ? 0 : ctx->coord[split[d]] * block[d];");
    cg_line(w, "    }");
    cg_line(w, "}");
    cg_blank(w);
}

/* scatter_param: a parameter's block of the whole tensor into this rank's shard (ZeRO 3's
 * shares through their range). */
static void emit_scatter_param(emitter *E, int zero3) {
    cg_writer *w = &E->w;
    int separate = E->dialect->separate_memory; /* the shard: through host memory */
    cg_line(w, "/* Parameter p's block of the whole tensor into this rank's shard%s. */", separate ? " (through host memory)" : "");
    if (zero3) emit_zero_params(E);
    cg_line(w, "static int scatter_param(struct_ctx *ctx, int p, const float *whole) {");
    w->indent++;
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, param_split[p], start, block);");
    if (zero3) {
        cg_line(w, "if (zero_params[p][0] >= 0) {");
        w->indent++;
        if (E->pipe_axis >= 0) cg_line(w, "if (ctx->coord[PIPELINE_AXIS] != param_stage[p]) return DMRT_OK; /* another stage's */");
        emit_share_scatter(E, "zero_params[p]", "ctx->params");
        w->indent--;
        cg_line(w, "}");
    }
    if (E->pipe_axis >= 0) cg_line(w, "if (ctx->param_offsets[p] < 0) return DMRT_OK; /* another stage's */");
    cg_block_into_shard(E, "ctx->params + ctx->param_offsets[p]");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* ZeRO: where each parameter's reduced gradient is (zero_grads). */
static void emit_zero_grads_table(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* ZeRO: where each parameter's reduced gradient is, in shares over an axis: {axis, share,");
    cg_line(w, " * coordinate 0's share in ctx->grads, the step per coordinate, the parameter's place in the");
    cg_line(w, " * range, the range}; axis -1: whole in ctx->grads. */");
    cg_line(w, "static const int64_t zero_grads[%d][6] = {", g->n_params);
    for (int p = 0; p < g->n_params; p++) {
        const dm_zero_bucket *b = zero_bucket_of(E, p);
        if (!b) {
            cg_line(w, "    {-1, 0, 0, 0, 0, 0}, /* %s */", V(E, g->params[p])->name);
            continue;
        }
        int two = E->zero->stage >= 2;
        cg_line(w, "    {%d, %lld, %lld, %lld, %lld, %lld}, /* %s */", b->axis, (long long)b->share,
                (long long)(two ? b->grad_at : b->grad_begin), (long long)(two ? 0 : b->share),
                (long long)(dm_grad_sum_offset(E->plan, g->grads[p]) - b->grad_begin), (long long)b->span,
                V(E, g->params[p])->name);
    }
    cg_line(w, "};");
}

/* gather_param: a parameter (or its gradient) whole on every rank, from the ranks' blocks
 * (ZeRO's shares and ranges gathered first). */
static void emit_gather_param(emitter *E, int zero3, int zero) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int n_axes = g->n_axes;
    cg_line(w, "/* Parameter p (or its gradient), whole, on every rank: each rank writes its block into");
    cg_line(w, " * zeros and the blocks are summed over the axes that split it (x + 0 is exact). Every");
    cg_line(w, " * rank must call it. */");
    cg_line(w, "static int gather_param(struct_ctx *ctx, int p, int grad, float *whole) {");
    w->indent++;
    cg_line(w, "const dmrt_tensor_desc *desc = &param_descs[p];");
    if (g->grads) cg_line(w, "const int8_t *split = grad ? grad_split[p] : param_split[p];");
    else cg_line(w, "const int8_t *split = param_split[p];");
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, split, start, block);");
    cg_line(w, "memset(whole, 0, (size_t)desc->numel * sizeof(float));");
    if (g->grads) cg_line(w, "if (grad && !ctx->grads) return DMRT_ERR_ARG;");
    else cg_line(w, "if (grad) return DMRT_ERR_ARG;");
    if (E->pipe_axis >= 0) {
        /* only the parameter's stage has its values (the others add zeros) */
        cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == param_stage[p]) {");
        w->indent++;
    }
    if (zero3) /* a parameter in shares has no offset */
        cg_line(w, "const float *shard = grad ? ctx->grads + ctx->grad_offsets[p] : ctx->param_offsets[p] < 0 ? NULL : ctx->params + ctx->param_offsets[p];");
    else if (g->grads) cg_line(w, "const float *shard = grad ? ctx->grads + ctx->grad_offsets[p] : ctx->params + ctx->param_offsets[p];");
    else cg_line(w, "const float *shard = ctx->params + ctx->param_offsets[p];");
    if (zero3 || zero) cg_line(w, "float *range = NULL;");
    int staged = (zero3 || zero) && E->dialect->separate_memory;
    if (staged) cg_line(w, "int on_host = 0; /* shard is in host memory (a range gathered there) */");
    if (zero3) {
        cg_line(w, "if (!grad && zero_params[p][0] >= 0) {");
        w->indent++;
        emit_range_gather(E, "zero_params[p]", "ctx->params + z[2]", "z[4]", "z[3]", "desc->name");
        w->indent--;
        cg_line(w, "}");
    }
    if (zero) {
        cg_line(w, "if (grad && zero_grads[p][0] >= 0) {");
        w->indent++;
        emit_range_gather(E, "zero_grads[p]", "ctx->grads + z[2] + ctx->coord[z[0]] * z[3]", "z[5]", "z[4]", "desc->name");
        w->indent--;
        cg_line(w, "}");
    }
    cg_shard_into_block(E, staged ? "on_host" : NULL);
    if (zero) cg_line(w, "dmrt_free(range);");
    if (E->pipe_axis >= 0) {
        w->indent--;
        cg_line(w, "}");
    }
    cg_line(w, "for (int axis = 0; axis < %d; axis++) {", n_axes);
    cg_line(w, "    int splits = %s;", E->pipe_axis >= 0 ? "axis == PIPELINE_AXIS" : "0");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) splits |= split[d] == axis;");
    cg_line(w, "    if (splits && dmrt_allreduce_sum(ctx->comm[axis], whole, desc->numel, desc->name) != 0) return comm_failed(ctx);");
    cg_line(w, "}");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The mesh, the split of every parameter and gradient, and the block moves between a
 * rank's shard and the whole tensor (initialisation, loading, saving). */
void emit_spmd_support(emitter *E) {
    int zero3 = 0;
    for (int b = 0; b < E->zero->n_buckets; b++) zero3 |= E->zero->bucket[b].param_at >= 0;
    int zero = E->zero->n_buckets > 0 && E->g->grads;
    emit_mesh_tables(E);
    emit_scatter_param(E, zero3);
    if (zero) emit_zero_grads_table(E);
    emit_gather_param(E, zero3, zero);
}

/* A serial program in a separate memory: parameters and gradients reach tools through
 * host copies (the descriptor's gather and scatter). */
void emit_host_param_copies(emitter *E) {
    cg_writer *w = &E->w;
    int trains = E->g->loss >= 0 && E->g->grads;
    if (E->n_narrow_only) emit_quantize_narrow(E);
    cg_line(w, "/* Parameter p (or its gradient) into whole, host memory. */");
    cg_line(w, "static int gather_param(struct_ctx *ctx, int p, int grad, float *whole) {");
    w->indent++;
    if (E->n_narrow_only) {
        cg_line(w, "if (!grad) {");
        w->indent++;
        emit_narrow_param_cases(E, 1);
        w->indent--;
        cg_line(w, "}");
    }
    if (trains) cg_line(w, "const float *shard = grad ? ctx->grads + ctx->grad_offsets[p] : ctx->params + ctx->param_offsets[p];");
    else cg_line(w, "const float *shard = grad ? NULL : ctx->params + ctx->param_offsets[p];");
    cg_line(w, "if (!shard) return DMRT_ERR_ARG;");
    E->dialect->copy(w, "whole", "shard", "(size_t)param_descs[p].numel * sizeof(float)", CG_DEVICE_TO_HOST, E->on_fail);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "/* Parameter p from whole, host memory. */");
    cg_line(w, "static int scatter_param(struct_ctx *ctx, int p, const float *whole) {");
    w->indent++;
    emit_narrow_param_cases(E, 0);
    E->dialect->copy(w, "ctx->params + ctx->param_offsets[p]", "whole", "(size_t)param_descs[p].numel * sizeof(float)",
                     CG_HOST_TO_DEVICE, E->on_fail);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The dialect's memory and host memory, in the generated gather and scatter functions'
 * terms: `block` and `start` (the rank's block of the whole tensor), `p` (its parameter's
 * shape in param_shapes), `whole`. A dialect whose memory the host cannot address copies
 * through a host buffer. */
void cg_block_into_shard(emitter *E, const char *shard) {
    cg_writer *w = &E->w;
    if (!E->dialect->separate_memory) {
        cg_line(w, "dmrt_block_read(whole, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, %s);", shard);
        return;
    }
    emit_host_block(E, "");
    cg_line(w, "dmrt_block_read(whole, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, host);");
    E->dialect->copy(w, shard, "host", "(size_t)n * sizeof(float)", CG_HOST_TO_DEVICE,
                     "{ dmrt_free(host); return device_failed(ctx); }");
    cg_line(w, "dmrt_free(host);");
}

void cg_shard_into_block(emitter *E, const char *on_host) {
    cg_writer *w = &E->w;
    int separate = E->dialect->separate_memory;
    if (separate) {
        /* on_host: the caller holds `range` (a gathered range, or NULL) until it returns */
        const char *release = on_host ? "dmrt_free(range); " : "";
        char on_fail[96];
        snprintf(on_fail, sizeof on_fail, "{ dmrt_free(host); %sreturn device_failed(ctx); }", release);
        emit_host_block(E, release);
        if (on_host) {
            cg_line(w, "if (!%s) {", on_host);
            w->indent++;
        }
        E->dialect->copy(w, "host", "shard", "(size_t)n * sizeof(float)", CG_DEVICE_TO_HOST, on_fail);
        cg_line(w, "shard = host;");
        if (on_host) {
            w->indent--;
            cg_line(w, "}");
        }
    }
    cg_line(w, "dmrt_block_write(shard, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, whole);");
    if (separate) cg_line(w, "dmrt_free(host);");
}

void emit_range_gather(emitter *E, const char *row, const char *send, const char *elems, const char *at, const char *name) {
    cg_writer *w = &E->w;
    cg_line(w, "/* its range, all-gathered from the ranks' shares%s */", E->dialect->separate_memory ? " (through host memory)" : "");
    cg_line(w, "const int64_t *z = %s;", row);
    cg_line(w, "range = (float *)dmrt_alloc((size_t)%s * sizeof(float));", elems);
    cg_line(w, "if (!range) return DMRT_ERR_NOMEM;");
    if (E->dialect->separate_memory) {
        cg_line(w, "float *share = (float *)dmrt_alloc((size_t)z[1] * sizeof(float));");
        cg_line(w, "if (!share) {");
        cg_line(w, "    dmrt_free(range);");
        cg_line(w, "    return DMRT_ERR_NOMEM;");
        cg_line(w, "}");
        E->dialect->copy(w, "share", send, "(size_t)z[1] * sizeof(float)", CG_DEVICE_TO_HOST,
                         "{ dmrt_free(share); dmrt_free(range); return device_failed(ctx); }");
        cg_line(w, "const int gathered = dmrt_allgather(ctx->comm[z[0]], share, range, z[1], %s);", name);
        cg_line(w, "dmrt_free(share);");
    } else {
        cg_line(w, "const int gathered = dmrt_allgather(ctx->comm[z[0]], %s, range, z[1], %s);", send, name);
    }
    cg_line(w, "if (gathered != 0) {");
    cg_line(w, "    dmrt_free(range);");
    cg_line(w, "    return comm_failed(ctx);");
    cg_line(w, "}");
    cg_line(w, "shard = range + %s;", at);
    if (E->dialect->separate_memory) cg_line(w, "on_host = 1;");
}
