/* emit_dropout.c: dropout(x, p) as a loop nest whose every element knows its index in the
 * whole (unsharded, whole-batch) tensor, so each rank draws for its block exactly the mask
 * the serial program draws there: the key of element i is (seed, ctx->step, the op's
 * number, i), one Philox block (runtime/rng.c, dmrt_dropout_keep). The backward pass is the
 * same op on dy, and a recomputed copy is the same op again: both redraw the same mask, so
 * none is stored. Forward (evaluation, ctx->training clear) copies x. The dialect's dropout
 * hook writes the kernel: C loops counting the index level by level, a CUDA kernel that
 * computes it per element (runtime/dmrt_philox.h holds both the index and the draw). */
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
            fprintf(err, "%s:%d:%d: error: dropout is not built for the %s target; compile with --target c\n",
                    E->source_path, v->loc.line, v->loc.col, E->dialect->name);
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

/* The levels of v's block: one per dim up to the last split one, then the rest as one. */
static void dropout_levels(const emitter *E, const ir_value *v, cg_dropout *k) {
    const ir_type *gt = &v->type, *lt = T(E, v->id);
    int last_split = -1;
    for (int d = 0; d < gt->rank; d++)
        if (gt->split[d] != IR_REPLICATED) last_split = d;
    k->levels = last_split + 1 + (last_split < gt->rank - 1 || gt->rank == 0); /* the split dims, then the rest */
    for (int l = 0; l < k->levels; l++) {
        k->size[l] = l <= last_split ? lt->shape[l] : dims_product(lt, l, lt->rank);
        k->whole[l] = l <= last_split ? gt->shape[l] : dims_product(gt, l, gt->rank);
        k->split_axis[l] = l <= last_split && gt->split[l] != IR_REPLICATED ? gt->split[l] : -1;
    }
    k->count = ir_numel(lt);
}

void emit_dropout(emitter *E, const ir_value *v) {
    cg_writer *w = &E->w;
    cg_dropout k = {.x = E->cname[v->operands[0]], .out = E->cname[v->id], .op = v->rng_op};
    dropout_levels(E, v, &k);
    /* drop when the 24-bit uniform is below ceil(p * 2^24): probability p to 2^-24 */
    k.threshold = (unsigned long long)ceil(v->scalar * 16777216.0);
    char scale[64], first[96];
    cg_float_literal(1.0 / (1.0 - v->scalar), scale, sizeof scale);
    micro_base(E, &v->type, first, sizeof first);
    k.scale = scale, k.first = first;
    cg_line(w, "/* p = %g: kept elements scaled by 1 / (1 - p), mask from (seed, step, dropout %d, index) */", v->scalar,
            v->rng_op);
    int backward = v->phase != PHASE_FORWARD; /* the gradient and recomputed copies: training */
    cg_line(w, backward ? "{" : "if (ctx->training) {");
    w->indent++;
    E->dialect->dropout(w, &k);
    w->indent--;
    if (!backward) {
        cg_line(w, "} else { /* forward: the identity */");
        w->indent++;
        cg_copy_elems(E, k.out, k.x, (long long)k.count, "float", CG_DEVICE_TO_DEVICE);
        w->indent--;
    }
    cg_line(w, "}");
}
