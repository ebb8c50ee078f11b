/* emit_zero.c: a ZeRO bucket's update (passes/zero.c): its gradients reduce-scattered,
 * this rank's share of the parameters updated with the optimizer state it holds, and
 * the parameters all-gathered in place (ZeRO 3: left in shares, and gathered where the
 * passes read them, passes/zero_gather.c). */
#include <stdio.h>
#include <stdlib.h>

#include "emitter.h"

/* Opens the block of member p's elements in this rank's share: the share is [share_begin,
 * share_begin + share) of the bucket's range, the parameter [at, at + n) of it, and the
 * block runs on [lo, hi), their overlap, when not empty. Closed by zero_close_member. */
void emit_share_scatter(emitter *E, const char *row, const char *storage) {
    cg_writer *w = &E->w;
    cg_line(w, "/* this rank's block, and of it the elements in this rank's share of the range */");
    cg_line(w, "const int64_t *z = %s;", row);
    cg_line(w, "int64_t n = 1;");
    cg_line(w, "for (int d = 0; d < param_shapes[p][0]; d++) n *= block[d];");
    cg_line(w, "float *local = (float *)dmrt_alloc((size_t)n * sizeof(float));");
    cg_line(w, "if (!local) return DMRT_ERR_NOMEM;");
    cg_line(w, "dmrt_block_read(whole, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, local);");
    cg_line(w, "const int64_t share_begin = ctx->coord[z[0]] * z[1];");
    cg_line(w, "const int64_t lo = share_begin > z[3] ? share_begin : z[3];");
    cg_line(w, "const int64_t hi = share_begin + z[1] < z[3] + n ? share_begin + z[1] : z[3] + n;");
    char dst[160];
    snprintf(dst, sizeof dst, "%s + z[2] + (lo - share_begin)", storage);
    cg_line(w, "if (lo < hi) {");
    w->indent++;
    E->dialect->copy(w, dst, "local + (lo - z[3])", "(size_t)(hi - lo) * sizeof(float)", CG_HOST_TO_DEVICE,
                     "{ dmrt_free(local); return device_failed(ctx); }");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "dmrt_free(local);");
    cg_line(w, "return DMRT_OK;");
}

void zero_open_member(emitter *E, const dm_zero_bucket *b, int p) {
    const ir_value *param = V(E, E->g->params[p]);
    long long at = (long long)E->zero->range_at[p], n = (long long)ir_numel(T(E, param->id));
    cg_line(&E->w, "/* %s: elements [%lld, %lld) of the range */", param->name, at, at + n);
    cg_line(&E->w, "{");
    E->w.indent++;
    cg_line(&E->w, "const int64_t lo = share_begin > %lld ? share_begin : %lld;", at, at);
    cg_line(&E->w, "const int64_t hi = share_begin + %lld < %lld ? share_begin + %lld : %lld;", (long long)b->share, at + n,
            (long long)b->share, at + n);
    cg_line(&E->w, "if (lo < hi) {");
    E->w.indent++;
}

void zero_close_member(emitter *E) {
    E->w.indent--;
    cg_line(&E->w, "}");
    E->w.indent--;
    cg_line(&E->w, "}");
}

/* Where this rank's share of the bucket's gradients is after the reduce-scatter: zero 1
 * puts it back in place in ctx->grads (where gathering the gradient, for dumps and
 * checks, finds it), zero 2 keeps it at the bucket's own place. */
void zero_grad_share(const emitter *E, const dm_zero_bucket *b, char *buf, size_t size) {
    if (E->zero->stage >= 2) snprintf(buf, size, "(ctx->grads + %lld)", (long long)b->grad_at);
    else snprintf(buf, size, "(ctx->grads + %lld + share_begin)", (long long)b->grad_begin);
}

static void declare_share_begin(emitter *E, const dm_zero_bucket *b) {
    cg_line(&E->w, "const int64_t share_begin = ctx->coord[%d] * (int64_t)%lld; /* this rank's share of the range */", b->axis,
            (long long)b->share);
}

/* The update of member p's elements in this rank's share. */
static void emit_member_update(emitter *E, const dm_zero_bucket *b, int p, const char *grad_share) {
    const ir_graph *g = E->g;
    const ir_value *param = V(E, g->params[p]);
    zero_open_member(E, b, p);
    /* the update op names its gradient and state */
    const ir_value *update = E->zero->update_of[p] >= 0 ? V(E, E->zero->update_of[p]) : NULL;
    const char *names[4] = {E->cname[param->id], E->cname[g->grads[p]], NULL, NULL};
    for (int j = 0; j < E->zero->states && update && j + 2 < update->n_operands; j++) {
        names[2 + j] = E->cname[update->operands[2 + j]];
        cg_line(&E->w, "float *%s = ctx->state + %lld + (lo - share_begin);", names[2 + j],
                (long long)(b->state_at + j * b->state_stride));
    }
    if (b->param_at >= 0) /* ZeRO 3: only the share is here */
        cg_line(&E->w, "float *%s = ctx->params + %lld + (lo - share_begin);", names[0], (long long)b->param_at);
    else
        cg_line(&E->w, "float *%s = ctx->params + %lld + lo;", names[0], (long long)b->param_begin);
    cg_line(&E->w, "const float *%s = %s + (lo - share_begin);", names[1], grad_share);
    ir_optimizer own;
    cg_update k = {.opt = cg_param_optimizer(E, p, &own), .count = "(hi - lo)", .param = names[0], .grad = names[1], .updates = cg_updates_done(E), .state0 = names[2],
                   .state1 = names[3]};
    if (g->optimizer.kind == OPTIM_SGD) E->dialect->sgd(&E->w, &k);
    else E->dialect->adamw(&E->w, &k);
    zero_close_member(E);
}

/* "first .. last (n)" of a bucket, for comments and the runtime's messages. */
static void bucket_label(const emitter *E, const dm_zero_bucket *b, char *label, size_t size) {
    const char *first = V(E, E->g->params[b->first])->name, *last = V(E, E->g->params[b->last])->name;
    if (b->first == b->last) snprintf(label, size, "%s", first);
    else snprintf(label, size, "%s .. %s (%d)", first, last, b->last - b->first + 1);
}

/* The members' updates from this rank's share of their gradients, then the parameters
 * all-gathered (ZeRO 1, 2). share_begin is declared. */
static void emit_bucket_updates(emitter *E, const dm_zero_bucket *b, const char *label) {
    char share[96], callee[96];
    zero_grad_share(E, b, share, sizeof share);
    for (int p = b->first; p <= b->last; p++) emit_member_update(E, b, p, share);
    if (b->param_at < 0) {
        cg_line(&E->w, "if (%sctx->comm[%d], ctx->params + %lld + share_begin, ctx->params + %lld, %lld, \"all-gather of the parameters %s\") != 0)",
            cg_comm_callee(E, "allgather", callee, sizeof callee), b->axis, (long long)b->param_begin, (long long)b->param_begin,
            (long long)b->share, label);
        cg_line(&E->w, "    return comm_failed(ctx);");
    }
}

/* The bucket's gradients reduce-scattered into this rank's share; share_begin declared. */
static void emit_bucket_reduce(emitter *E, const dm_zero_bucket *b, const char *label) {
    const ir_graph *g = E->g;
    int two = E->zero->stage >= 2;
    /* the whole range, its gaps zero: in ctx->grads (zero 1) or assembled in scratch (zero 2) */
    char whole[96], share[96];
    if (two) snprintf(whole, sizeof whole, "ctx->scratch");
    else snprintf(whole, sizeof whole, "(ctx->grads + %lld)", (long long)b->grad_begin);
    int64_t filled = 0;
    for (int p = b->first; p <= b->last; p++) {
        int grad = g->grads[p];
        int64_t at = dm_grad_sum_offset(E->plan, grad) - b->grad_begin, n = ir_numel(T(E, grad));
        char dst[160];
        if (two && at > filled) {
            snprintf(dst, sizeof dst, "(%s + %lld)", whole, (long long)filled);
            cg_zero_elems(E, dst, (long long)(at - filled), "float");
        }
        snprintf(dst, sizeof dst, "(%s + %lld)", whole, (long long)at);
        cg_copy_elems(E, dst, E->cname[V(E, grad)->operands[0]], (long long)n, "float", CG_DEVICE_TO_DEVICE);
        filled = at + n;
    }
    if (two && b->span > filled) {
        char dst[160];
        snprintf(dst, sizeof dst, "(%s + %lld)", whole, (long long)filled);
        cg_zero_elems(E, dst, (long long)(b->span - filled), "float");
    }
    if (!two || E->update_part != 1) declare_share_begin(E, b); /* zero 2 reduces into a share that does not need it */
    zero_grad_share(E, b, share, sizeof share);
    char callee[96];
    int half = dm_zero_reduces_half(g, b->axis);
    if (half) {
        /* --compress bf16|fp16: 16-bit values on the wire, summed in float; the C target's
         * work in scratch after what the bucket holds there, the CUDA target's staged */
        char work[96] = "";
        int64_t used = two ? b->span : b->share;
        if (!E->dialect->separate_memory)
            snprintf(work, sizeof work, "ctx->scratch + %lld, %lld, ", (long long)used, (long long)(E->scratch_elems - used));
        cg_line(&E->w, "if (%sctx->comm[%d], %s, %s, %lld, %s, %s\"reduce-scatter of the gradients %s in %s\") != 0)",
                cg_comm_callee(E, "reduce_scatter_sum_half", callee, sizeof callee), b->axis, whole,
                two ? share : "ctx->scratch", (long long)b->share, half == 1 ? "DMRT_BF16" : "DMRT_FP16", work, label,
                half == 1 ? "bf16" : "fp16");
    } else {
        cg_line(&E->w, "if (%sctx->comm[%d], %s, %s, %lld, \"reduce-scatter of the gradients %s\") != 0)",
                cg_comm_callee(E, "reduce_scatter_sum", callee, sizeof callee), b->axis, whole, two ? share : "ctx->scratch",
                (long long)b->share, label);
    }
    cg_line(&E->w, "    return comm_failed(ctx);");
    /* zero 1 receives its share in scratch and puts it back in place */
    if (!two) cg_copy_elems(E, share, "ctx->scratch", (long long)b->share, "float", CG_DEVICE_TO_DEVICE);
}

void emit_zero_bucket(emitter *E, const dm_zero_bucket *b) {
    const ir_graph *g = E->g;
    char label[300];
    bucket_label(E, b, label, sizeof label);
    long long k = (long long)axis_size(E, b->axis);
    int updates = E->update_part != 1;
    cg_line(&E->w, "/* ZeRO %d over %s: the gradients of %s, %lld elements in all, reduce-scattered%s", E->zero->stage,
            g->axes[b->axis].name, label, (long long)b->span, updates ? ":" : " into this rank's");
    if (updates) {
        cg_line(&E->w, " * this rank updates its %lld (1/%lld) with the optimizer state it holds for them%s", (long long)b->share,
                k, b->param_at >= 0 ? " (the parameters" : ", and");
        cg_line(&E->w, " * %s */",
                b->param_at >= 0 ? "stay in shares: the passes gather them where they read them)." : "the parameters are all-gathered.");
    } else {
        cg_line(&E->w, " * %lld (1/%lld); updated after clipping */", (long long)b->share, k);
    }
    cg_line(&E->w, "{");
    E->w.indent++;
    emit_bucket_reduce(E, b, label);
    if (updates) emit_bucket_updates(E, b, label);
    E->w.indent--;
    cg_line(&E->w, "}");
}

void emit_zero_bucket_updates(emitter *E, const dm_zero_bucket *b) {
    char label[300];
    bucket_label(E, b, label, sizeof label);
    cg_line(&E->w, "/* ZeRO %d: this rank's share of the gradients of %s (reduce-scattered above) updates its %lld", E->zero->stage,
            label, (long long)b->share);
    cg_line(&E->w, " * (1/%lld) with the optimizer state it holds for them%s */", (long long)axis_size(E, b->axis),
            b->param_at >= 0 ? "; the parameters stay in shares" : ", and the parameters are all-gathered");
    cg_line(&E->w, "{");
    E->w.indent++;
    declare_share_begin(E, b);
    emit_bucket_updates(E, b, label);
    E->w.indent--;
    cg_line(&E->w, "}");
}

static const dm_zero_bucket *gathered_bucket(const emitter *E, const ir_value *gather) {
    const dm_zero_bucket *b = zero_bucket_of(E, V(E, gather->operands[0])->param_index);
    if (!b || b->param_at < 0) {
        fprintf(stderr, "dmc: internal error: '%s' gathers parameters no ZeRO 3 bucket holds in shares\n", gather->name);
        abort();
    }
    return b;
}

void emit_zero_gather(emitter *E, const ir_value *v) {
    const dm_zero_bucket *b = gathered_bucket(E, v);
    char label[300], callee[96];
    bucket_label(E, b, label, sizeof label);
    cg_line(&E->w, "/* ZeRO 3: the parameters %s, all-gathered over %s from the ranks' shares of %lld; started,", label,
            E->g->axes[b->axis].name, (long long)b->share);
    cg_line(&E->w, " * computation goes on until their first use */");
    cg_line(&E->w, "if (%sctx->comm[%d], ctx->params + %lld, %s, %lld, \"all-gather of the parameters %s\") != 0)",
            cg_comm_callee(E, "allgather_start", callee, sizeof callee), b->axis, (long long)b->param_at, E->cname[v->id],
            (long long)b->share, label);
    cg_line(&E->w, "    return comm_failed(ctx);");
}

void emit_param_view(emitter *E, const ir_value *v) {
    const ir_value *gather = V(E, v->operands[0]), *prev = v->id > 0 ? V(E, v->id - 1) : NULL;
    if (!prev || prev->op != OP_PARAM_VIEW || prev->operands[0] != gather->id) {
        char callee[96];
        cg_line(&E->w, "/* the all-gather of %s is done before the first use */", E->cname[gather->id]);
        cg_line(&E->w, "if (%sctx->comm[%d]) != 0) return comm_failed(ctx);", cg_comm_callee(E, "comm_wait", callee, sizeof callee),
                gathered_bucket(E, gather)->axis);
    }
    cg_line(&E->w, "/* %s is elements [%lld, %lld) of %s */", E->cname[v->id], (long long)v->offset,
            (long long)(v->offset + ir_numel(T(E, v->id))), E->cname[gather->id]);
}
