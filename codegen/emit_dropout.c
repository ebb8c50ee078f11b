/* emit_dropout.c: dropout(x, p) as a loop nest whose every element knows its index in the
 * whole (unsharded, whole-batch) tensor, so each rank draws for its block exactly the mask
 * the serial program draws there: the key of element i is (seed, ctx->step, the op's
 * number, i), one Philox block (runtime/rng.c, dmrt_dropout_keep). The backward pass is the
 * same op on dy, and a recomputed copy is the same op again: both redraw the same mask, so
 * none is stored. Forward (evaluation, ctx->training clear) copies x. The C dialect's only (cg_capabilities). */
#include <math.h>
#include <string.h>

#include "emitter.h"

/* Whether the program has dropout ops (the context then keeps the seed and the training
 * flag); refuses them for a dialect that cannot (cg_capabilities.dropout). */
int emit_dropout_prepare(emitter *E, FILE *err) {
    for (int i = 0; i < E->g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->op != OP_DROPOUT) continue;
        if (!E->dialect->can.dropout) {
            fprintf(err, "%s:%d:%d: error: dropout is built for the C target only; compile with --target c\n",
                    E->source_path, v->loc.line, v->loc.col);
            return -1;
        }
        E->dropout = 1;
    }
    return 0;
}

/* The index in the whole tensor of this micro-batch's first element: micro-batch m holds
 * the step's rows [m * rows, (m + 1) * rows) of a value that leads with the batch
 * (passes/supported.c refuses dropout of other values with micro-batches). */
static void micro_base(const emitter *E, const ir_type *global, char *buf, size_t size) {
    const ir_graph *g = E->g;
    int leads = global->rank > 0 && g->batch_dim && global->dim_name[0] && strcmp(global->dim_name[0], g->batch_dim) == 0;
    if (E->in_micro && g->microbatches > 1 && leads)
        snprintf(buf, size, "(uint64_t)micro * %lldu", (long long)ir_numel(global));
    else
        snprintf(buf, size, "0");
}

/* One loop per dim up to the last split one, then the rest as one loop: the inner
 * index of every level is the global one of the level above times the dim's size. */
static void emit_masked_loops(emitter *E, const ir_value *v, const char *threshold, const char *scale) {
    cg_writer *w = &E->w;
    const ir_type *gt = &v->type, *lt = T(E, v->id);
    int last_split = -1;
    for (int d = 0; d < gt->rank; d++)
        if (gt->split[d] != IR_REPLICATED) last_split = d;
    int loops = last_split + 1 + (last_split < gt->rank - 1 || gt->rank == 0); /* the split dims, then the rest */
    char base[96];
    micro_base(E, gt, base, sizeof base);
    cg_line(w, "const uint64_t first = %s; /* this micro-batch's first element in the step's */", base);
    cg_line(w, "int64_t local = 0; /* the element in this rank's block */");
    for (int l = 0; l < loops; l++) {
        int64_t size = l <= last_split ? lt->shape[l] : dims_product(lt, l, lt->rank);
        int64_t whole = l <= last_split ? gt->shape[l] : dims_product(gt, l, gt->rank);
        char pos[96]; /* the global position along this level */
        if (l <= last_split && gt->split[l] != IR_REPLICATED)
            snprintf(pos, sizeof pos, "ctx->coord[%d] * %lld + i%d", gt->split[l], (long long)size, l);
        else
            snprintf(pos, sizeof pos, "i%d", l);
        cg_line(w, "for (int64_t i%d = 0; i%d < %lld; i%d++) {", l, l, (long long)size, l);
        w->indent++;
        if (l == 0)
            cg_line(w, "const uint64_t at_1 = (uint64_t)(%s);", pos);
        else
            cg_line(w, "const uint64_t at_%d = at_%d * %lldu + (uint64_t)(%s);", l + 1, l, (long long)whole, pos);
    }
    cg_line(w, "%s[local] = dmrt_dropout_keep(ctx->seed, ctx->step, %d, first + at_%d, %s) ? %s[local] * %s : 0.0f;",
            E->cname[v->id], v->rng_op, loops, threshold, E->cname[v->operands[0]], scale);
    cg_line(w, "local++;");
    for (int l = 0; l < loops; l++) {
        w->indent--;
        cg_line(w, "}");
    }
}

void emit_dropout(emitter *E, const ir_value *v) {
    cg_writer *w = &E->w;
    /* drop when the 24-bit uniform is below ceil(p * 2^24): probability p to 2^-24 */
    double t = ceil(v->scalar * 16777216.0);
    char scale[64];
    cg_float_literal(1.0 / (1.0 - v->scalar), scale, sizeof scale);
    char threshold[32];
    snprintf(threshold, sizeof threshold, "%lluu", (unsigned long long)t);
    cg_line(w, "/* p = %g: kept elements scaled by 1 / (1 - p), mask from (seed, step, dropout %d, index) */", v->scalar,
            v->rng_op);
    int backward = v->phase != PHASE_FORWARD; /* the gradient and recomputed copies: training */
    if (!backward) {
        cg_line(w, "if (ctx->training) {");
        w->indent++;
    } else {
        cg_line(w, "{");
        w->indent++;
    }
    emit_masked_loops(E, v, threshold, scale);
    w->indent--;
    if (!backward) {
        cg_line(w, "} else {");
        long long n = (long long)ir_numel(T(E, v->id));
        cg_line(w, "    for (int64_t i = 0; i < %lld; i++) %s[i] = %s[i]; /* forward: the identity */", n,
                E->cname[v->id], E->cname[v->operands[0]]);
    }
    cg_line(w, "}");
}
