/* emit_compress.c: gradient compression on the data axis (passes/compress.c): each
 * compressed bucket's tensors as a table of segments, PowerSGD's shared start, and the
 * bucket's reduction through dmrt_comm.h's compressed calls instead of the allreduce
 * (under fp16's loss scaling, top-k's and PowerSGD's checked and unscaled first); the
 * error-feedback state's tensors in checkpoints and their moves (dmrt_state_layout). */
#include <stdio.h>
#include <stdlib.h>

#include "emitter.h"

static int compressed(const emitter *E) { return E->compress->n_buckets > 0; }
static int powersgd(const emitter *E) { return compressed(E) && E->compress->kind == COMPRESS_POWERSGD; }

void emit_compress_fields(emitter *E) {
    if (powersgd(E))
        cg_line(&E->w, "uint64_t compress_seed; /* create's: PowerSGD's factors start from it, and a factor of zeros is drawn again */");
}

static const char *kind_text(const emitter *E) {
    switch (E->compress->kind) {
    case COMPRESS_BF16: return "bf16";
    case COMPRESS_FP16: return "fp16";
    case COMPRESS_TOPK: return "top-k";
    default: return "PowerSGD";
    }
}

/* The segments of bucket k: its tensors' places in its range and how each is reduced. */
static void emit_segment_table(emitter *E, int k) {
    const ir_graph *g = E->g;
    const dm_compress_bucket *b = &E->compress->bucket[k];
    int topk = E->compress->kind == COMPRESS_TOPK, n = b->last - b->first + 1;
    cg_line(&E->w, "static const dmrt_%s_segment compress_segments_%d[%d] = {", topk ? "topk" : "powersgd", k, n);
    E->w.indent++;
    for (int p = b->first; p <= b->last; p++) {
        const ir_value *grad = V(E, g->grads[p]);
        long long at = (long long)(E->plan->offset[grad->id] - b->grad_begin), count = (long long)ir_numel(T(E, grad->id));
        const char *name = V(E, g->params[p])->name;
        if (topk) {
            cg_line(&E->w, "{%lld, %lld, %lld}, /* %s: %lld of %lld elements */", at, count,
                    (long long)dm_topk_keep(&g->compress, count), name, (long long)dm_topk_keep(&g->compress, count), count);
            continue;
        }
        int64_t rows, cols;
        int squeezed = dm_powersgd_matrix(g, grad, &rows, &cols);
        if (squeezed)
            cg_line(&E->w, "{%lld, %lld, %lld, 1, %d}, /* %s: %lld x %lld as rank-%d factors */", at, (long long)rows,
                    (long long)cols, p, name, (long long)rows, (long long)cols, g->compress.rank);
        else
            cg_line(&E->w, "{%lld, 1, %lld, 0, %d}, /* %s: summed exactly */", at, count, p, name);
    }
    E->w.indent--;
    cg_line(&E->w, "};");
}

/* One checkpoint tensor of top-k's or PowerSGD's state: a gradient's residual, or its Q. */
typedef struct compress_state {
    int param, stage, is_q;  /* its parameter and pipeline stage; 1: PowerSGD's Q, 0: the residual */
    int64_t at, elems;       /* its place in ctx->state on a rank holding it, and its elements there */
    int64_t blocks, cols;    /* Q: the gradient's blocks over the mesh, its local matrix's columns */
} compress_state;

/* The state tensors in checkpoint order (as the comment of emit_state_comment lists them)
 * into out (NULL: counted only); how many. */
static int compress_states(const emitter *E, compress_state *out) {
    const ir_graph *g = E->g;
    int n = 0;
    if (E->compress->kind != COMPRESS_TOPK && E->compress->kind != COMPRESS_POWERSGD) return 0;
    for (int k = 0; k < E->compress->n_buckets; k++) {
        const dm_compress_bucket *b = &E->compress->bucket[k];
        if (b->residual_at < 0) continue;
        int64_t q_at = b->q_at;
        for (int p = b->first; p <= b->last; p++) {
            const ir_value *grad = V(E, g->grads[p]);
            int64_t local = ir_numel(T(E, grad->id)), rows, cols;
            if (out)
                out[n] = (compress_state){.param = p, .stage = b->stage, .at = b->residual_at + E->plan->offset[grad->id] - b->grad_begin,
                                          .elems = local};
            n++;
            if (E->compress->kind != COMPRESS_POWERSGD || !dm_powersgd_matrix(g, grad, &rows, &cols)) continue;
            if (out)
                out[n] = (compress_state){.param = p, .stage = b->stage, .is_q = 1, .at = q_at, .elems = cols * g->compress.rank,
                                          .blocks = ir_numel(&grad->type) / (local ? local : 1), .cols = cols};
            q_at += cols * g->compress.rank;
            n++;
        }
    }
    return n;
}

/* The state tensors as a list (free it), their count into *n. */
static compress_state *compress_state_list(const emitter *E, int *n) {
    *n = compress_states(E, NULL);
    compress_state *s = malloc(sizeof *s * (size_t)(*n ? *n : 1));
    if (!s) abort();
    compress_states(E, s);
    return s;
}

/* Where the error-feedback state of each parameter lives: optimizer state, under these names. */
static void emit_state_comment(emitter *E) {
    int n;
    compress_state *s = compress_state_list(E, &n);
    cg_line(&E->w, "/* Error-feedback state, kept in ctx->state after the optimizer's (elements: offset, count):");
    for (int i = 0; i < n; i++)
        cg_line(&E->w, " *   %s.%s: %lld, %lld", V(E, E->g->params[s[i].param])->name, s[i].is_q ? "powersgd_q" : "error_feedback",
                (long long)s[i].at, (long long)s[i].elems);
    cg_line(&E->w, " * (each rank its own%s; checkpoints hold them as gather_compress_state says) */",
            E->plan->stages > 1 ? ", in the state of the parameter's pipeline stage" : "");
    free(s);
}

void emit_compress_tables(emitter *E) {
    if (!compressed(E) || E->compress->kind == COMPRESS_BF16 || E->compress->kind == COMPRESS_FP16) return;
    char name[64];
    dm_compress_name(&E->g->compress, name, sizeof name);
    cg_line(&E->w, "/* --compress %s: the tensors of each compressed gradient bucket, where they start in", name);
    cg_line(&E->w, " * its range of ctx->grads and how they are reduced (dmrt_comm.h). */");
    for (int k = 0; k < E->compress->n_buckets; k++) emit_segment_table(E, k);
    emit_state_comment(E);
    cg_blank(&E->w);
    if (!powersgd(E)) return;
    int device = E->dialect->separate_memory; /* Q is in device memory: drawn on the host, copied there */
    cg_line(&E->w, "/* PowerSGD's Q factors, drawn from the seed: the same on every rank of the data axis. */");
    cg_line(&E->w, "static int compress_init(struct_ctx *ctx, uint64_t seed) {");
    E->w.indent++;
    cg_line(&E->w, "ctx->compress_seed = seed;");
    for (int k = 0; k < E->compress->n_buckets; k++) {
        const dm_compress_bucket *b = &E->compress->bucket[k];
        if (!b->q_elems) continue;
        int guard = E->pipe_axis >= 0;
        if (guard) cg_line(&E->w, "if (ctx->coord[%d] == %d) /* the rank of the bucket's pipeline stage */", E->pipe_axis,
                           rank_of(E, b->stage));
        if (device)
            cg_line(&E->w, "%sif (dmrt_gpu_powersgd_init(ctx->gpu, ctx->state + %lld, compress_segments_%d, %d, %d, seed) != "
                           "DMRT_OK) return DMRT_ERR_DEVICE;", guard ? "    " : "", (long long)b->q_at, k,
                    b->last - b->first + 1, E->g->compress.rank);
        else
            cg_line(&E->w, "%sdmrt_powersgd_init(ctx->state + %lld, compress_segments_%d, %d, %d, seed);", guard ? "    " : "",
                    (long long)b->q_at, k, b->last - b->first + 1, E->g->compress.rank);
    }
    cg_line(&E->w, "return DMRT_OK;");
    E->w.indent--;
    cg_line(&E->w, "}");
    cg_blank(&E->w);
}

void emit_compress_create(emitter *E) {
    if (!powersgd(E)) return;
    cg_line(&E->w, "if (compress_init(ctx, seed) != DMRT_OK) {");
    cg_line(&E->w, "    snprintf(ctx->error, sizeof ctx->error, \"PowerSGD's factors: %%s\", %s);", E->dialect->comm_error);
    cg_line(&E->w, "    goto fail;");
    cg_line(&E->w, "}");
}

/* fp16's loss scaling with top-k or PowerSGD. Their residuals (and PowerSGD's Q) carry
 * from step to step, so a step the scaler skips must not reach them: one non-finite
 * gradient would stay in them for good. Before the first compressed reduction of an update
 * function, every rank checks its own still-scaled gradients and the mesh agrees (a sum of
 * one float, over every axis as the scaler's own check: a skip decided by another stage
 * must not leave this stage's residuals touched); a step to be skipped reduces none of
 * them, and the scaler's check (emit_loss_unscale) skips it. A clean step's gradients are
 * unscaled before the reduction, not after: the residual then holds unscaled gradients,
 * which stay right when the scale halves or doubles (scaled ones would be carried into the
 * next step at 2x or 0.5x their weight), and the scaler leaves them as they are. */
int cg_compress_checks_scaled(const emitter *E) {
    return E->g->loss_scale > 0 && compressed(E) &&
           (E->compress->kind == COMPRESS_TOPK || E->compress->kind == COMPRESS_POWERSGD);
}

/* Whether b is reduced in the function being emitted, and the first one reduced there
 * (emit_ops.c reaches the buckets in the order of their leads). */
static int in_function(const emitter *E, const dm_compress_bucket *b) {
    return E->cur_stage < 0 || b->stage == E->cur_stage;
}

static int first_in_function(const emitter *E, const dm_compress_bucket *b) {
    for (int k = 0; k < E->compress->n_buckets; k++)
        if (in_function(E, &E->compress->bucket[k]) && E->compress->bucket[k].lead < b->lead) return 0;
    return 1;
}

/* The squares of every compressed bucket's partials in this function (still loss-scaled;
 * each rank its own) into sum_squares: NaN or inf when an element is. by_storage: name each
 * partial by where it lies (a rank's update function, which declares no locals of its
 * stages' values), else by its local in the stage's function. */
static void add_partial_squares(emitter *E, int by_storage) {
    const ir_graph *g = E->g;
    char count[32], where[160];
    for (int k = 0; k < E->compress->n_buckets; k++) {
        const dm_compress_bucket *b = &E->compress->bucket[k];
        if (!in_function(E, b)) continue;
        for (int p = b->first; p <= b->last; p++) {
            const ir_value *grad = V(E, g->grads[p]);
            snprintf(count, sizeof count, "%lld", (long long)ir_numel(T(E, grad->id)));
            if (by_storage) {
                char expr[140];
                cg_storage_expr(E, grad->operands[0], expr, sizeof expr);
                snprintf(where, sizeof where, "(%s)", expr);
            } else {
                snprintf(where, sizeof where, "%s", E->cname[grad->operands[0]]);
            }
            E->dialect->sum_squares(&E->w, where, count, "sum_squares");
        }
    }
}

/* compress_not_finite: the squares of the compressed partials of this function (rank < 0),
 * or of every chunk of pipeline rank `rank`, not finite; summed over the mesh. */
static void emit_check(emitter *E, int rank) {
    cg_line(&E->w, "float compress_not_finite = 0.0f;");
    cg_line(&E->w, "{");
    E->w.indent++;
    cg_line(&E->w, "double sum_squares = 0.0; /* a float's square stays finite in a double */");
    if (rank < 0) add_partial_squares(E, 0);
    for (int st = rank; rank >= 0 && st < E->stages; st += E->ranks > 1 ? E->ranks : E->stages) {
        E->cur_stage = st;
        add_partial_squares(E, 1);
    }
    if (rank >= 0) E->cur_stage = -1;
    cg_line(&E->w, "compress_not_finite = isfinite(sum_squares) ? 0.0f : 1.0f;");
    E->w.indent--;
    cg_line(&E->w, "}");
    cg_sum_over_mesh(E, "compress_not_finite", "loss scaling: the check before compression");
}

static void emit_feedback_check(emitter *E) {
    cg_line(&E->w, "/* fp16 loss scaling: a step the scaler skips must not reach the error-feedback state, so this");
    cg_line(&E->w, " * rank's own gradients (still scaled) are checked first and the mesh agrees; none is reduced on");
    cg_line(&E->w, " * a step to be skipped, and the scaler's check below skips it (docs/comm.md) */");
    emit_check(E, -1);
}

void emit_rank_compress_check(emitter *E, int rank) {
    cg_line(&E->w, "/* fp16 loss scaling: a step the scaler skips must not reach the error-feedback state, so every");
    cg_line(&E->w, " * chunk's compressed partials (still scaled) are checked before any chunk reduces one, and the");
    cg_line(&E->w, " * mesh agrees; none is reduced on a step to be skipped (each chunk's reduction is told) */");
    emit_check(E, rank);
}

/* The bucket's compressed reduction itself: the runtime's call for the kind. */
static void emit_compressed_call(emitter *E, const dm_compress_bucket *b, const char *label) {
    const ir_graph *g = E->g;
    int k = (int)(b - E->compress->bucket), n_segs = b->last - b->first + 1;
    char name[64];
    dm_compress_name(&g->compress, name, sizeof name);
    cg_line(&E->w, "/* --compress %s over %s: %s */", name, g->axes[b->axis].name,
            g->compress.kind == COMPRESS_TOPK ? "each rank sends its largest elements (residual included), values and indices"
            : g->compress.kind == COMPRESS_POWERSGD ? "the matrices as low-rank factors (residual included), the vectors exactly"
                                                    : "16-bit values on the wire, summed in float");
    char grads[64], residual[64], q[64], what[400];
    snprintf(grads, sizeof grads, "ctx->grads + %lld", (long long)b->grad_begin);
    snprintf(residual, sizeof residual, "ctx->state + %lld", (long long)b->residual_at);
    if (b->q_elems) snprintf(q, sizeof q, "ctx->state + %lld", (long long)b->q_at);
    else snprintf(q, sizeof q, "NULL"); /* no matrix to factor in this bucket */
    snprintf(what, sizeof what, "%s %s", kind_text(E), label);
    /* the C target's calls work in the context's scratch; the CUDA target's (dmrt_cuda.h) are
     * the same calls staged through host memory, their work there */
    int device = E->dialect->separate_memory;
    const char *callee = device ? "dmrt_gpu_" : "dmrt_", *gpu = device ? "ctx->gpu, " : "";
    char work[64] = "";
    if (!device) snprintf(work, sizeof work, "ctx->scratch, %lld, ", (long long)E->scratch_elems);
    switch (g->compress.kind) {
    case COMPRESS_BF16:
    case COMPRESS_FP16:
        cg_line(&E->w, "if (%sallreduce_sum_half(%sctx->comm[%d], %s, %lld, %s, %s\"%s\") != 0)", callee, gpu, b->axis, grads,
                (long long)b->elems, g->compress.kind == COMPRESS_BF16 ? "DMRT_BF16" : "DMRT_FP16", work, what);
        break;
    case COMPRESS_TOPK:
        cg_line(&E->w, "if (%sallreduce_topk(%sctx->comm[%d], %s, %s, %lld, compress_segments_%d, %d,", callee, gpu, b->axis,
                grads, residual, (long long)b->elems, k, n_segs);
        cg_line(&E->w, "                        %s\"%s\") != 0)", work, what);
        break;
    default:
        cg_line(&E->w, "if (%sallreduce_powersgd(%sctx->comm[%d], %s, %s, %s, %lld, compress_segments_%d, %d, %d,", callee, gpu,
                b->axis, grads, residual, q, (long long)b->elems, k, n_segs, g->compress.rank);
        cg_line(&E->w, "                            ctx->compress_seed, ctx->step, %s\"%s\") != 0)", work, what);
        break;
    }
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* After the members' partials are in place in ctx->grads: the bucket's compressed reduction
 * (under fp16's loss scaling with error feedback, checked and unscaled first). */
void emit_compressed_reduce(emitter *E, const dm_compress_bucket *b, const char *label) {
    if (!cg_compress_checks_scaled(E)) {
        emit_compressed_call(E, b, label);
        return;
    }
    /* (a chunk's reduction of the interleaved schedule is given its rank's check: update_half 1) */
    if (first_in_function(E, b) && E->update_half != 1) emit_feedback_check(E);
    char grads[64];
    snprintf(grads, sizeof grads, "(ctx->grads + %lld)", (long long)b->grad_begin);
    char count[32];
    snprintf(count, sizeof count, "%lld", (long long)b->elems);
    cg_line(&E->w, "if (compress_not_finite == 0.0f) {");
    E->w.indent++;
    cg_line(&E->w, "const float unscale = (float)(1.0 / ctx->loss_scale.scale); /* the residual keeps unscaled gradients */");
    E->dialect->scale(&E->w, grads, count, "unscale");
    emit_compressed_call(E, b, label);
    E->w.indent--;
    cg_line(&E->w, "}");
}

/* ---- checkpoints: the error-feedback state --------------------------------------------- */

int cg_compress_state_count(const emitter *E) { return compress_states(E, NULL); }

static int data_axis(const emitter *E) { return E->compress->bucket[0].axis; }

void emit_compress_state_descs(emitter *E) {
    int n;
    compress_state *s = compress_state_list(E, &n);
    if (!n) { /* (no bucket: no data axis to name) */
        free(s);
        return;
    }
    int64_t ranks = E->g->axes[data_axis(E)].size;
    for (int i = 0; i < n; i++) {
        const ir_value *param = V(E, E->g->params[s[i].param]);
        const ir_type *t = &param->type;
        char dims[256];
        int rank, len;
        if (s[i].is_q) {
            rank = 3;
            len = snprintf(dims, sizeof dims, "%lld, %lld, %d", (long long)s[i].blocks, (long long)s[i].cols, E->g->compress.rank);
        } else if (t->rank + 1 <= IR_MAX_RANK) { /* [data ranks, ...its parameter] */
            rank = t->rank + 1;
            len = snprintf(dims, sizeof dims, "%lld", (long long)ranks);
            for (int d = 0; d < t->rank && len > 0 && (size_t)len < sizeof dims; d++)
                len += snprintf(dims + len, sizeof dims - (size_t)len, ", %lld", (long long)t->shape[d]);
        } else { /* no room for the rows' dim: [data ranks, its parameter's elements] */
            rank = 2;
            len = snprintf(dims, sizeof dims, "%lld, %lld", (long long)ranks, (long long)ir_numel(t));
        }
        (void)len;
        long long numel = s[i].is_q ? (long long)(s[i].blocks * s[i].elems) : (long long)(ranks * ir_numel(t));
        cg_line(&E->w, "{\"%s.%s\", DMRT_F32, %d, {%s}, %lld},", param->name, s[i].is_q ? "powersgd_q" : "error_feedback",
                rank, dims, numel);
    }
    free(s);
}

void emit_compress_state_layouts(emitter *E) {
    int n;
    compress_state *s = compress_state_list(E, &n);
    for (int i = 0; i < n; i++)
        cg_line(&E->w, "    %s, /* %s */", s[i].is_q ? "DMRT_STATE_WARM_START" : "DMRT_STATE_PER_DATA_RANK",
                V(E, E->g->params[s[i].param])->name);
    free(s);
}

/* The tables of gather_compress_state and scatter_compress_state. */
static void emit_compress_state_tables(emitter *E, const compress_state *s, int n) {
    cg_writer *w = &E->w;
    cg_line(w, "/* Gradient compression's state as checkpoints hold it, after the optimizer's: {its parameter, the");
    cg_line(w, " * pipeline coordinate of the ranks holding it, its offset in ctx->state there, its elements on a rank,");
    cg_line(w, " * 1: PowerSGD's Q (0: the residual)}, and the mesh axis splitting each dim of its gradient (-1: whole");
    cg_line(w, " * on every rank). */");
    cg_line(w, "static const int64_t compress_states[%d][5] = {", n);
    for (int i = 0; i < n; i++)
        cg_line(w, "    {%d, %d, %lld, %lld, %d}, /* %s.%s */", s[i].param, rank_of(E, s[i].stage), (long long)s[i].at, (long long)s[i].elems,
                s[i].is_q, V(E, E->g->params[s[i].param])->name, s[i].is_q ? "powersgd_q" : "error_feedback");
    cg_line(w, "};");
    cg_line(w, "static const int8_t compress_split[%d][%d] = {", n, IR_MAX_RANK);
    for (int i = 0; i < n; i++) {
        const ir_type *t = T(E, E->g->grads[s[i].param]);
        char row[128] = "";
        size_t len = 0;
        for (int d = 0; d < IR_MAX_RANK; d++) {
            int k = snprintf(row + len, sizeof row - len, "%s%d", d ? ", " : "", d < t->rank ? t->split[d] : -1);
            if (k > 0) len += (size_t)k;
        }
        cg_line(w, "    {%s},", row);
    }
    cg_line(w, "};");
    cg_line(w, "/* Which row of state j's checkpoint tensor this rank's part is: a residual's, its data rank; a Q's,");
    cg_line(w, " * its gradient's block (start and block as rank_block gives them). */");
    cg_line(w, "static int64_t compress_state_row(const struct_ctx *ctx, int j, const int64_t *start, const int64_t *block) {");
    cg_line(w, "    const int p = (int)compress_states[j][0];");
    cg_line(w, "    if (!compress_states[j][4]) return ctx->coord[%d]; /* the data axis */", data_axis(E));
    cg_line(w, "    int64_t row = 0;");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) row = row * (param_shapes[p][1 + d] / block[d]) + start[d] / block[d];");
    cg_line(w, "    return row;");
    cg_line(w, "}");
}

/* gather_compress_state: rows of zeros, this rank's part written into its row, the rows summed
 * over the axes whose ranks hold different rows. */
static void emit_compress_gather(emitter *E, int n_optimizer) {
    cg_writer *w = &E->w;
    int pipe = E->pipe_axis >= 0, separate = E->dialect->separate_memory;
    cg_line(w, "/* Compression state j whole (checkpoint tensor %d + j): a residual as [data ranks, ...its parameter],", n_optimizer);
    cg_line(w, " * row r data rank r's, whole over the other axes; a Q as [blocks, columns, rank], row b the factor of");
    cg_line(w, " * the gradient's block b, which every rank of the data axis holds alike. The holding ranks write");
    cg_line(w, " * their rows into zeros and the rows are summed over the axes that tell them apart (x + 0 is");
    cg_line(w, " * exact). Every rank must call it. */");
    cg_line(w, "static int gather_compress_state(struct_ctx *ctx, int j, float *rows) {");
    w->indent++;
    cg_line(w, "const int p = (int)compress_states[j][0], is_q = (int)compress_states[j][4];");
    cg_line(w, "const dmrt_tensor_desc *desc = &state_descs[%d + j];", n_optimizer);
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, compress_split[j], start, block);");
    cg_line(w, "memset(rows, 0, (size_t)desc->numel * sizeof(float));");
    if (pipe) {
        cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == compress_states[j][1]) {");
        w->indent++;
    }
    cg_line(w, "float *whole = rows + compress_state_row(ctx, j, start, block) * (desc->numel / desc->shape[0]);");
    cg_line(w, "const float *shard = ctx->state + compress_states[j][2];");
    cg_line(w, "if (is_q) {");
    w->indent++;
    if (separate) E->dialect->copy(w, "whole", "shard", "(size_t)compress_states[j][3] * sizeof(float)", CG_DEVICE_TO_HOST, E->on_fail);
    else cg_line(w, "memcpy(whole, shard, (size_t)compress_states[j][3] * sizeof(float));");
    w->indent--;
    cg_line(w, "} else {");
    w->indent++;
    cg_shard_into_block(E, NULL);
    w->indent--;
    cg_line(w, "}");
    if (pipe) {
        w->indent--;
        cg_line(w, "}");
    }
    cg_line(w, "for (int axis = 0; axis < %d; axis++) {", E->g->n_axes);
    cg_line(w, "    int splits = %s(!is_q && axis == %d);", pipe ? "axis == PIPELINE_AXIS || " : "", data_axis(E));
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) splits |= compress_split[j][d] == axis;");
    cg_line(w, "    if (splits && dmrt_allreduce_sum(ctx->comm[axis], rows, desc->numel, desc->name) != 0) return comm_failed(ctx);");
    cg_line(w, "}");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

static void emit_compress_scatter(emitter *E, int n_optimizer) {
    cg_writer *w = &E->w;
    cg_line(w, "/* Compression state j's row for this rank into its storage (local, no communication). */");
    cg_line(w, "static int scatter_compress_state(struct_ctx *ctx, int j, const float *rows) {");
    w->indent++;
    cg_line(w, "const int p = (int)compress_states[j][0];");
    cg_line(w, "const dmrt_tensor_desc *desc = &state_descs[%d + j];", n_optimizer);
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, compress_split[j], start, block);");
    if (E->pipe_axis >= 0)
        cg_line(w, "if (ctx->coord[PIPELINE_AXIS] != compress_states[j][1]) return DMRT_OK; /* another stage's */");
    cg_line(w, "const float *whole = rows + compress_state_row(ctx, j, start, block) * (desc->numel / desc->shape[0]);");
    cg_line(w, "if (compress_states[j][4]) {");
    w->indent++;
    if (E->dialect->separate_memory)
        E->dialect->copy(w, "ctx->state + compress_states[j][2]", "whole", "(size_t)compress_states[j][3] * sizeof(float)",
                         CG_HOST_TO_DEVICE, E->on_fail);
    else cg_line(w, "memcpy(ctx->state + compress_states[j][2], whole, (size_t)compress_states[j][3] * sizeof(float));");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_block_into_shard(E, "ctx->state + compress_states[j][2]");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_compress_state_moves(emitter *E, int n_optimizer) {
    int n;
    compress_state *s = compress_state_list(E, &n);
    if (!n) {
        free(s);
        return;
    }
    emit_compress_state_tables(E, s, n);
    emit_compress_gather(E, n_optimizer);
    emit_compress_scatter(E, n_optimizer);
    free(s);
}
