/* emit_zero.c: a ZeRO bucket's update (passes/zero.c): its gradients reduce-scattered,
 * this rank's share of the parameters updated with the optimizer state it holds, and
 * the parameters all-gathered in place. */
#include <stdio.h>

#include "emitter.h"

/* The update of member p's elements in this rank's share: the share is [share_begin,
 * share_begin + share) of the bucket's range, the parameter [at, at + n) of it. */
static void emit_member_update(emitter *E, const dm_zero_bucket *b, int p, const char *grad_share) {
    const ir_graph *g = E->g;
    const ir_value *param = V(E, g->params[p]);
    long long at = (long long)(E->plan->offset[g->params[p]] - b->param_begin), n = (long long)ir_numel(T(E, param->id));
    cg_line(&E->w, "/* %s: elements [%lld, %lld) of the range */", param->name, at, at + n);
    cg_line(&E->w, "{");
    E->w.indent++;
    cg_line(&E->w, "const int64_t lo = share_begin > %lld ? share_begin : %lld;", at, at);
    cg_line(&E->w, "const int64_t hi = share_begin + %lld < %lld ? share_begin + %lld : %lld;", (long long)b->share, at + n,
            (long long)b->share, at + n);
    cg_line(&E->w, "if (lo < hi) {");
    E->w.indent++;
    /* the update op names its gradient and state */
    const ir_value *update = E->zero->update_of[p] >= 0 ? V(E, E->zero->update_of[p]) : NULL;
    const char *names[4] = {E->cname[param->id], E->cname[g->grads[p]], NULL, NULL};
    for (int j = 0; j < E->zero->states && update && j + 2 < update->n_operands; j++) {
        names[2 + j] = E->cname[update->operands[2 + j]];
        cg_line(&E->w, "float *%s = ctx->state + %lld + (lo - share_begin);", names[2 + j],
                (long long)(b->state_at + j * b->state_stride));
    }
    cg_line(&E->w, "float *%s = ctx->params + %lld + lo;", names[0], (long long)b->param_begin);
    cg_line(&E->w, "const float *%s = %s + (lo - share_begin);", names[1], grad_share);
    cg_update k = {.opt = &g->optimizer, .count = "(hi - lo)", .param = names[0], .grad = names[1], .state0 = names[2],
                   .state1 = names[3]};
    if (g->optimizer.kind == OPTIM_SGD) E->dialect->sgd(&E->w, &k);
    else E->dialect->adamw(&E->w, &k);
    E->w.indent--;
    cg_line(&E->w, "}");
    E->w.indent--;
    cg_line(&E->w, "}");
}

void emit_zero_bucket(emitter *E, const dm_zero_bucket *b) {
    const ir_graph *g = E->g;
    int two = E->zero->stage >= 2, members = b->last - b->first + 1;
    const char *first = V(E, g->params[b->first])->name, *last = V(E, g->params[b->last])->name;
    char label[300];
    if (members == 1) snprintf(label, sizeof label, "%s", first);
    else snprintf(label, sizeof label, "%s .. %s (%d)", first, last, members);
    long long k = (long long)axis_size(E, b->axis);
    cg_line(&E->w, "/* ZeRO %d over %s: the gradients of %s, %lld elements in all, reduce-scattered:", E->zero->stage,
            g->axes[b->axis].name, label, (long long)b->span);
    cg_line(&E->w, " * this rank updates its %lld (1/%lld) with the optimizer state it holds for them, and", (long long)b->share, k);
    cg_line(&E->w, " * the parameters are all-gathered. */");
    cg_line(&E->w, "{");
    E->w.indent++;
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
            zero_elems(E, dst, (long long)(at - filled), "float");
        }
        snprintf(dst, sizeof dst, "(%s + %lld)", whole, (long long)at);
        copy_elems(E, dst, E->cname[V(E, grad)->operands[0]], (long long)n, "float", CG_DEVICE_TO_DEVICE);
        filled = at + n;
    }
    if (two && b->span > filled) {
        char dst[160];
        snprintf(dst, sizeof dst, "(%s + %lld)", whole, (long long)filled);
        zero_elems(E, dst, (long long)(b->span - filled), "float");
    }
    cg_line(&E->w, "const int64_t share_begin = ctx->coord[%d] * (int64_t)%lld; /* this rank's share of the range */", b->axis,
            (long long)b->share);
    /* zero 1 receives its share in scratch and puts it back in place, where gathering the
     * gradient (dump, checks) finds it */
    if (two) snprintf(share, sizeof share, "(ctx->grads + %lld)", (long long)b->grad_at);
    else snprintf(share, sizeof share, "(ctx->grads + %lld + share_begin)", (long long)b->grad_begin);
    char callee[96];
    cg_line(&E->w, "if (%sctx->comm[%d], %s, %s, %lld, \"reduce-scatter of the gradients %s\") != 0)",
            comm_callee(E, "reduce_scatter_sum", callee, sizeof callee), b->axis, whole, two ? share : "ctx->scratch",
            (long long)b->share, label);
    cg_line(&E->w, "    return comm_failed(ctx);");
    if (!two) copy_elems(E, share, "ctx->scratch", (long long)b->share, "float", CG_DEVICE_TO_DEVICE);
    for (int p = b->first; p <= b->last; p++) emit_member_update(E, b, p, share);
    cg_line(&E->w, "if (%sctx->comm[%d], ctx->params + %lld + share_begin, ctx->params + %lld, %lld, \"all-gather of the parameters %s\") != 0)",
            comm_callee(E, "allgather", callee, sizeof callee), b->axis, (long long)b->param_begin, (long long)b->param_begin,
            (long long)b->share, label);
    cg_line(&E->w, "    return comm_failed(ctx);");
    E->w.indent--;
    cg_line(&E->w, "}");
}
