/* microbatch_loss.c: with micro-batches (accumulate = K, or a pipeline schedule's
 * microbatches = M) the step's loss and gradients are the mean of the micro-batches'
 * (codegen: emit_gradient_means). That is the whole batch's only when the loss is a mean
 * over the batch's rows, each row computed from its own: cross_entropy, or mean(...) over
 * the batch dim, then combined linearly with terms that read no batch (a weight penalty).
 * A loss that sums over the batch would come out M times too small, one that combines rows
 * (a batch statistic) would use each micro-batch's own rows, both without a word; such
 * programs are refused here, pointing at the op. Data parallelism needs none of this: the
 * sharding pass derives the collectives from the ops themselves.
 *
 * Each forward value is classed, in order (operands come first):
 *   FREE  reads no input's batch (parameters, constants, what they make);
 *   ROWS  row r of it is made from row r of the inputs alone (the batch dim leading);
 *   MEAN  a mean over the batch's rows of ROWS values, or a linear function of such means
 *         and FREE values (the sum of two, a product or quotient by a FREE one, ...);
 *   BAD   anything else, with the op that made it so. */
#include <stdlib.h>
#include <string.h>

#include "batch_rows.h"
#include "passes.h"

enum { FREE, ROWS, MEAN, BAD };

enum { MIXES_ROWS, SUMS_BATCH, NONLINEAR, BATCH_STATISTIC };

typedef struct {
    int kind;
    int culprit; /* BAD: the value whose op made it so */
    int why;     /* BAD: MIXES_ROWS, SUMS_BATCH, NONLINEAR or BATCH_STATISTIC */
} loss_class;

/* Ops that carry a mean through linearly: the result's elements are sums of the operand's
 * times FREE factors. */
static int linear(const ir_value *v, const loss_class *ops) {
    switch (v->op) {
    case OP_NEG:
    case OP_IDENTITY:
    case OP_CAST:
    case OP_RESHAPE:
    case OP_TRANSPOSE:
    case OP_SUM:
    case OP_MEAN:
    case OP_SUM_TO:
    case OP_BROADCAST:
    case OP_ADD:
    case OP_SUB: return 1;
    case OP_MUL: return ops[0].kind == FREE || ops[1].kind == FREE;
    case OP_DIV: return ops[1].kind == FREE;
    default: return 0;
    }
}

/* Whether t leads with the batch's rows: the batch dim first, or, where a reshape merged it
 * with the dims after it (which names the result's dims anew), an unnamed leading dim of a
 * whole number of rows. */
static int leads_with_rows(const ir_type *t, const char *batch, int64_t rows) {
    int at = ir_batch_dim_at(t, batch);
    if (at != -1) return at == 0;
    return t->rank >= 1 && !t->dim_name[0] && rows > 0 && t->shape[0] % rows == 0;
}

static loss_class class_of(const ir_graph *g, const ir_value *v, const loss_class *cls, const char *batch,
                           int64_t rows) {
    loss_class ops[8] = {{0}};
    int any[4] = {0};
    int n = v->n_operands < 8 ? v->n_operands : 8;
    for (int k = 0; k < n; k++) {
        ops[k] = cls[v->operands[k]];
        any[ops[k].kind] = 1;
    }
    if (v->op == OP_INPUT) return (loss_class){ir_batch_dim_at(&v->type, batch) == 0 ? ROWS : FREE, -1, 0};
    if (any[BAD]) {
        for (int k = 0; k < n; k++)
            if (ops[k].kind == BAD) return ops[k];
    }
    if (!any[ROWS] && !any[MEAN]) return (loss_class){FREE, -1, 0};
    int lead = leads_with_rows(&v->type, batch, rows);
    if (any[MEAN]) {
        /* a mean may be scaled, added to and reduced further, but not mixed with rows (a
         * batch statistic applied to them), put back beside the batch, or transformed */
        if (any[ROWS] || ir_batch_dim_at(&v->type, batch) != -1) return (loss_class){BAD, v->id, BATCH_STATISTIC};
        if (!linear(v, ops)) return (loss_class){BAD, v->id, NONLINEAR};
        return (loss_class){MEAN, -1, 0};
    }
    /* rows only: a reduction over the batch (to no rows, or to one of many), or an op that
     * mixes its rows */
    int reduces_batch = !lead;
    for (int k = 0; k < n && lead; k++) {
        const ir_type *t = &g->values[v->operands[k]]->type;
        if (ops[k].kind == ROWS && v->type.shape[0] == 1 && t->shape[0] != 1) reduces_batch = 1;
    }
    if (reduces_batch) {
        /* cross_entropy means over every row; mean(...) over the batch dim */
        if (v->op == OP_CROSS_ENTROPY || v->op == OP_MEAN) return (loss_class){MEAN, -1, 0};
        return (loss_class){BAD, v->id, v->op == OP_SUM || v->op == OP_SUM_TO ? SUMS_BATCH : MIXES_ROWS};
    }
    /* a reshape merging the batch with the dims after it keeps whole rows together */
    int merges_rows = v->op == OP_RESHAPE && ir_batch_dim_at(&v->type, batch) == -1 &&
                      ir_batch_dim_at(&g->values[v->operands[0]]->type, batch) == 0;
    if (!merges_rows && ir_mixes_rows(g, v, batch)) return (loss_class){BAD, v->id, MIXES_ROWS};
    return (loss_class){ROWS, -1, 0};
}

/* A parameter shaped by the batch dim would be made at the micro-batch's size (the program
 * is lowered for one micro-batch): fewer rows than the file of weights and the serial
 * program have, an embedding's ids past its table. The errors found. */
static int params_of_batch(const ir_graph *g, dm_diag *d) {
    int errors = 0;
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *v = g->values[g->params[p]];
        if (ir_batch_dim_at(&v->type, g->batch_dim) == -1) continue;
        dm_error(d, v->loc, "parameter '%s' has the batch dim '%s' in its shape, which %d micro-batches split: it would be "
                 "made with a micro-batch's %lld rows, not the batch's %lld (give it a dim of its own)",
                 v->name, g->batch_dim, g->microbatches, (long long)(g->batch_whole / g->microbatches),
                 (long long)g->batch_whole);
        errors++;
    }
    if (errors && g->schedule_loc.line > 0) dm_note(d, g->schedule_loc, "the micro-batches are set here");
    return errors;
}

int pass_microbatch_loss(const ir_graph *g, dm_diag *d) {
    if (g->microbatches <= 1 || !g->batch_dim) return 0;
    if (params_of_batch(g, d)) return 1;
    if (g->loss < 0) return 0;
    loss_class *cls = calloc((size_t)g->n_values + 1, sizeof *cls);
    if (!cls) abort();
    for (int i = 0; i <= g->loss && i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        cls[i] = class_of(g, v, cls, g->batch_dim, g->batch_whole / g->microbatches);
    }
    loss_class loss = cls[g->loss];
    free(cls);
    if (loss.kind == FREE || loss.kind == MEAN) return 0;
    const ir_value *at = g->values[loss.culprit >= 0 ? loss.culprit : g->loss];
    const char *op = ir_op_info_of(at->op)->name;
    int M = g->microbatches;
    if (loss.why == SUMS_BATCH)
        dm_error(d, at->loc, "the loss sums over the batch dim '%s', which %d micro-batches split: the step takes the mean "
                 "of the micro-batches' losses and gradients, %d times too small for a sum (make the loss a mean over "
                 "'%s', or use one micro-batch)", g->batch_dim, M, M, g->batch_dim);
    else if (loss.why == NONLINEAR)
        dm_error(d, at->loc, "the loss is a nonlinear function (%s) of a mean over the batch dim '%s', which %d "
                 "micro-batches split: the mean of the micro-batches' values is not the whole batch's (the loss must be "
                 "linear in its means over '%s', or use one micro-batch)", op, g->batch_dim, M, g->batch_dim);
    else if (loss.why == BATCH_STATISTIC)
        dm_error(d, at->loc, "the loss applies a mean over the batch dim '%s' back to its rows (%s), and %d micro-batches "
                 "split '%s': each micro-batch's mean would be of its own rows only, and the step would not be the whole "
                 "batch's (the loss must be a mean over '%s' of values each row makes alone, or use one micro-batch)",
                 g->batch_dim, op, M, g->batch_dim, g->batch_dim);
    else
        dm_error(d, at->loc, "the loss depends on rows of the batch dim '%s' combined with each other (by %s here, "
                 "or an op it feeds), which %d micro-batches split: each micro-batch would see only its own rows, and the "
                 "step would not be the whole batch's (the loss must be a mean over '%s' of values each row makes alone, "
                 "or use one micro-batch)", g->batch_dim, op, M, g->batch_dim);
    if (g->schedule_loc.line > 0) dm_note(d, g->schedule_loc, "the micro-batches are set here");
    return 1;
}
