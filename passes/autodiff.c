/* autodiff.c: reverse-mode differentiation of g->loss. requires: a typed forward graph
 * and a loss; leaves: backward values appended (phase backward) and g->grads[p], a
 * persistent gradient buffer (role grad) for every parameter.
 *
 * Gradient rules are per op class, as the shape rules are. A value's gradient is the
 * sum of its consumers' contributions, accumulated with add in reverse order. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct autodiff {
    ir_graph *g;
    dm_diag *d;
    int *grad;       /* (values at start) gradient value id, -1 when none yet */
    ir_value *origin; /* the forward value being differentiated: its stage runs the new ops */
    int errors;
} autodiff;

static ir_value *V(autodiff *A, int id) { return A->g->values[id]; }

/* A backward value whose attributes the caller sets before finish() types it. */
static ir_value *start(autodiff *A, ir_op op, const int *operands, int n, dm_loc loc, const char *name) {
    ir_value *v = ir_add(A->g, op, operands, n, loc);
    v->phase = PHASE_BACKWARD;
    v->name = name;
    v->origin = A->origin;
    return v;
}

static int finish(autodiff *A, ir_value *v) {
    A->errors += shapes_infer(A->g, v, A->d);
    return v->id;
}

static int emit(autodiff *A, ir_op op, const int *operands, int n, dm_loc loc, const char *name) {
    return finish(A, start(A, op, operands, n, loc, name));
}

static int emit1(autodiff *A, ir_op op, int x, dm_loc loc, const char *name) { return emit(A, op, &x, 1, loc, name); }

static int emit2(autodiff *A, ir_op op, int a, int b, dm_loc loc, const char *name) {
    int ab[2] = {a, b};
    return emit(A, op, ab, 2, loc, name);
}

static int emit_const(autodiff *A, double value, dm_loc loc) {
    ir_value *v = ir_add(A->g, OP_CONST, NULL, 0, loc);
    v->phase = PHASE_BACKWARD;
    v->origin = A->origin;
    v->role = ROLE_CONST;
    v->scalar = value;
    shapes_infer(A->g, v, A->d);
    return v->id;
}

/* Sums the broadcast dims of t away so that it has the shape of `like`. */
static int sum_to(autodiff *A, int t, const ir_type *like, dm_loc loc, const char *name) {
    const ir_type *tt = &V(A, t)->type;
    int lead = tt->rank - like->rank;
    uint32_t axes = 0;
    for (int i = 0; i < tt->rank; i++)
        if (i < lead || (like->shape[i - lead] == 1 && tt->shape[i] != 1)) axes |= 1u << i;
    if (!axes) return t;
    ir_value *v = start(A, OP_SUM_TO, &t, 1, loc, name);
    v->axes = axes;
    v->type = *like;
    v->type.dtype = DT_F32;
    return finish(A, v);
}

static int broadcast(autodiff *A, int t, const ir_type *to, uint32_t axes, dm_loc loc, const char *name) {
    ir_value *v = start(A, OP_BROADCAST, &t, 1, loc, name);
    v->axes = axes;
    v->type = *to;
    return finish(A, v);
}

static void accumulate(autodiff *A, int target, int contribution, dm_loc loc) {
    if (A->grad[target] < 0) {
        A->grad[target] = contribution;
        return;
    }
    ir_value *t = V(A, target);
    const char *name = t->name ? ir_internf(A->g, "d_%s", t->name) : NULL;
    A->grad[target] = emit2(A, OP_ADD, A->grad[target], contribution, loc, name);
}

/* Adds the contribution of v's gradient dy to each operand that needs one. */
static void backprop(autodiff *A, ir_value *v, int dy, const char *needs) {
    const ir_op_info *info = ir_op_info_of(v->op);
    dm_loc loc = v->loc;
    int x0 = v->n_operands > 0 ? v->operands[0] : -1;
    int x1 = v->n_operands > 1 ? v->operands[1] : -1;
    const char *n0 = x0 >= 0 && V(A, x0)->name ? ir_internf(A->g, "d_%s", V(A, x0)->name) : NULL;
    const char *n1 = x1 >= 0 && V(A, x1)->name ? ir_internf(A->g, "d_%s", V(A, x1)->name) : NULL;
    switch (info->cls) {
    case OPC_SOURCE:
        return;
    case OPC_UNARY: {
        if (v->op == OP_DROPOUT) { /* linear: the same mask (same key) on dy */
            ir_value *gv = start(A, OP_DROPOUT, &dy, 1, loc, n0);
            gv->scalar = v->scalar;
            gv->rng_op = v->rng_op;
            accumulate(A, x0, finish(A, gv), loc);
            return;
        }
        int ops[3] = {x0, v->id, dy};
        ir_value *gv = start(A, OP_UNARY_GRAD, ops, 3, loc, n0);
        gv->unary = v->op;
        accumulate(A, x0, finish(A, gv), loc);
        return;
    }
    case OPC_BINARY: {
        const ir_type *ta = &V(A, x0)->type, *tb = &V(A, x1)->type;
        if (x0 == x1 && (v->op == OP_MUL || v->op == OP_ADD)) {
            /* x * x (x + x): both operands' contributions are one tensor, made once and
             * doubled (an exact add) */
            int c = v->op == OP_MUL ? emit2(A, OP_MUL, dy, x0, loc, n0) : dy;
            c = sum_to(A, c, ta, loc, n0);
            accumulate(A, x0, emit2(A, OP_ADD, c, c, loc, n0), loc);
            return;
        }
        if (needs[x0]) {
            int c = dy;
            if (v->op == OP_MUL) c = emit2(A, OP_MUL, dy, x1, loc, n0);
            if (v->op == OP_DIV) c = emit2(A, OP_DIV, dy, x1, loc, n0);
            accumulate(A, x0, sum_to(A, c, ta, loc, n0), loc);
        }
        if (needs[x1]) {
            int c = dy;
            if (v->op == OP_SUB) c = emit1(A, OP_NEG, dy, loc, n1);
            if (v->op == OP_MUL) c = emit2(A, OP_MUL, dy, x0, loc, n1);
            if (v->op == OP_DIV) {
                /* d(a/b)/db = -(a/b)/b */
                int t = emit2(A, OP_MUL, dy, v->id, loc, n1);
                t = emit2(A, OP_DIV, t, x1, loc, n1);
                c = emit1(A, OP_NEG, t, loc, n1);
            }
            accumulate(A, x1, sum_to(A, c, tb, loc, n1), loc);
        }
        return;
    }
    case OPC_REDUCE: {
        const ir_type *tx = &V(A, x0)->type;
        int c = dy;
        if (v->op == OP_MEAN) {
            int64_t n = ir_numel(tx) / ir_numel(&v->type);
            c = emit2(A, OP_MUL, dy, emit_const(A, 1.0 / (double)n, loc), loc, n0);
        }
        accumulate(A, x0, broadcast(A, c, tx, v->axes, loc, n0), loc);
        return;
    }
    case OPC_BROADCAST: {
        /* the new dims summed away: sum_to where they lead (its rules drop leading dims),
         * a sum where one sits between x's dims (expand's repeats) */
        int leading = (v->axes & (v->axes + 1)) == 0;
        ir_value *s = start(A, leading ? OP_SUM_TO : OP_SUM, &dy, 1, loc, n0);
        s->axes = v->axes;
        s->type = V(A, x0)->type;
        accumulate(A, x0, finish(A, s), loc);
        return;
    }
    case OPC_RESHAPE: {
        ir_value *r = start(A, OP_RESHAPE, &dy, 1, loc, n0);
        r->type = V(A, x0)->type;
        accumulate(A, x0, finish(A, r), loc);
        return;
    }
    case OPC_TRANSPOSE: {
        ir_value *t = start(A, OP_TRANSPOSE, &dy, 1, loc, n0);
        for (int i = 0; i < v->type.rank; i++) t->perm[v->perm[i]] = i;
        accumulate(A, x0, finish(A, t), loc);
        return;
    }
    case OPC_MATMUL: {
        if (v->trans_a) {
            dm_error(A->d, loc, "internal: no gradient rule for a transposed-left matmul");
            A->errors++;
            return;
        }
        if (needs[x0]) {
            /* y = a @ b: da = dy @ b^T;  y = a @ b^T: da = dy @ b */
            ir_value *m = start(A, OP_MATMUL, (int[]){dy, x1}, 2, loc, n0);
            m->trans_b = !v->trans_b;
            m->batch_dims = v->batch_dims;
            accumulate(A, x0, finish(A, m), loc);
        }
        if (needs[x1]) {
            /* db = a^T @ dy (rows of a and dy flattened unless batched); with trans_b,
             * db = dy^T @ a */
            int ops[2] = {x0, dy};
            if (v->trans_b) ops[0] = dy, ops[1] = x0;
            ir_value *m = start(A, OP_MATMUL, ops, 2, loc, n1);
            m->trans_a = 1;
            m->batch_dims = v->batch_dims;
            accumulate(A, x1, finish(A, m), loc);
        }
        return;
    }
    case OPC_SOFTMAX: {
        if (v->op != OP_SOFTMAX) break;
        ir_value *gv = start(A, OP_SOFTMAX_GRAD, (int[]){v->id, dy}, 2, loc, n0);
        gv->axis = v->axis;
        gv->causal = v->causal;
        gv->scalar = v->scalar;
        accumulate(A, x0, finish(A, gv), loc);
        return;
    }
    case OPC_MASK: {
        /* masked elements do not depend on x: their gradient is zero */
        ir_value *gv = start(A, OP_CAUSAL_MASK, &dy, 1, loc, n0);
        gv->scalar = 0.0;
        accumulate(A, x0, finish(A, gv), loc);
        return;
    }
    case OPC_NORM: {
        if (v->op != OP_LAYERNORM) break;
        int x2 = v->operands[2];
        if (needs[x0]) {
            ir_value *gv = start(A, OP_LAYERNORM_GRAD, (int[]){x0, x1, dy}, 3, loc, n0);
            gv->scalar = v->scalar;
            accumulate(A, x0, finish(A, gv), loc);
        }
        if (needs[x1]) {
            ir_value *gv = start(A, OP_LAYERNORM_WGRAD, (int[]){x0, dy}, 2, loc, n1);
            gv->scalar = v->scalar;
            accumulate(A, x1, finish(A, gv), loc);
        }
        if (needs[x2]) {
            const char *n2 = V(A, x2)->name ? ir_internf(A->g, "d_%s", V(A, x2)->name) : NULL;
            accumulate(A, x2, sum_to(A, dy, &V(A, x2)->type, loc, n2), loc);
        }
        return;
    }
    case OPC_SLICE: {
        /* slice and pad are each other's gradient */
        ir_value *gv = start(A, v->op == OP_SLICE ? OP_PAD : OP_SLICE, &dy, 1, loc, n0);
        gv->axis = v->axis;
        gv->offset = v->offset;
        gv->type = V(A, x0)->type;
        accumulate(A, x0, finish(A, gv), loc);
        return;
    }
    case OPC_GATHER: {
        if (v->op != OP_EMBED) break;
        if (needs[x0]) {
            ir_value *gv = start(A, OP_EMBED_GRAD, (int[]){x1, dy}, 2, loc, n0);
            gv->type = V(A, x0)->type;
            accumulate(A, x0, finish(A, gv), loc);
        }
        return;
    }
    case OPC_LOSS: {
        /* through the statistics to the logits: the gradient reads the forward's statistics
         * (the statistics alone get none, as they are only ever read by the loss) */
        if (v->op != OP_CROSS_ENTROPY) break;
        const ir_value *stats = V(A, x0);
        int logits = stats->operands[0];
        int ops[4] = {logits, stats->operands[1], dy, x0};
        const char *name = V(A, logits)->name ? ir_internf(A->g, "d_%s", V(A, logits)->name) : NULL;
        accumulate(A, logits, emit(A, OP_CROSS_ENTROPY_GRAD, ops, 4, loc, name), loc);
        return;
    }
    case OPC_ATTENTION: {
        if (v->op != OP_ATTENTION) break;
        /* one fused backward from the forward's row log-sum-exp (read in place, after the
         * result): it makes the scores again block by block and writes dq, dk and dv
         * stacked, each read in place (grouped k and v's at the start of their parts) */
        const char *name = v->name ? v->name : "attention";
        int lse = emit1(A, OP_ATTENTION_LSE, v->id, loc, ir_internf(A->g, "%s.lse", name));
        int ops[6] = {x0, x1, v->operands[2], v->id, lse, dy};
        ir_value *gv = start(A, OP_ATTENTION_GRAD, ops, 6, loc, ir_internf(A->g, "d_%s.qkv", name));
        gv->scalar = v->scalar;
        gv->causal = v->causal;
        gv->heads_inner = v->heads_inner;
        gv->kv_group = v->kv_group;
        int stacked = finish(A, gv);
        for (int part = 0; part < 3; part++) {
            int x = v->operands[part];
            if (!needs[x]) continue;
            ir_value *pv = start(A, OP_STACKED_PART, &stacked, 1, loc,
                                 V(A, x)->name ? ir_internf(A->g, "d_%s", V(A, x)->name) : NULL);
            pv->offset = part;
            accumulate(A, x, finish(A, pv), loc);
        }
        return;
    }
    case OPC_VIEW:
    case OPC_UNARY_GRAD:
    case OPC_LOSS_GRAD:
    case OPC_UPDATE:
    case OPC_COLLECTIVE: /* inserted after autodiff (passes/shard.c) */
    case OPC_CAST:       /* inserted after autodiff (passes/precision.c) */
        break;
    }
    dm_error(A->d, loc, "internal: %s cannot be differentiated", info->name);
    A->errors++;
}

int pass_autodiff(ir_graph *g, dm_diag *d) {
    if (g->loss < 0) return 0;
    int n = g->n_values;
    autodiff A = {.g = g, .d = d, .grad = malloc((size_t)n * sizeof(int))};
    char *needs = calloc((size_t)n, 1);
    if (!A.grad || !needs) abort();
    /* needs[v]: v depends on a parameter, so gradients flow through it */
    for (int i = 0; i < n; i++) {
        ir_value *v = g->values[i];
        A.grad[i] = -1;
        needs[i] = v->op == OP_PARAM;
        for (int k = 0; k < v->n_operands && !needs[i]; k++) needs[i] = needs[v->operands[k]];
    }
    A.origin = g->values[g->loss];
    A.grad[g->loss] = emit_const(&A, 1.0, g->values[g->loss]->loc);
    g->values[A.grad[g->loss]]->loss_seed = 1;
    for (int i = g->loss; i >= 0; i--) {
        ir_value *v = g->values[i];
        if (A.grad[i] < 0 || !needs[i] || v->op == OP_PARAM) continue;
        A.origin = v;
        backprop(&A, v, A.grad[i], needs);
    }
    /* Each parameter's gradient gets a buffer of its own (role grad): a shared value
     * (the same dy reaching two parameters) is copied. */
    g->grads = malloc((size_t)(g->n_params ? g->n_params : 1) * sizeof(int));
    if (!g->grads) abort();
    for (int p = 0; p < g->n_params; p++) {
        ir_value *param = g->values[g->params[p]];
        int gid = A.grad[param->id];
        A.origin = param;
        const char *name = ir_internf(g, "%s.grad", param->name);
        if (gid < 0) {
            int zero = emit_const(&A, 0.0, param->loc);
            gid = broadcast(&A, zero, &param->type, (1u << param->type.rank) - 1, param->loc, name);
        } else if (g->values[gid]->role != ROLE_TEMP || g->values[gid]->phase != PHASE_BACKWARD ||
                   ir_op_info_of(g->values[gid]->op)->cls == OPC_VIEW) {
            /* copied: a value outside the backward's temporaries, or a view of another buffer */
            gid = emit1(&A, OP_IDENTITY, gid, param->loc, name);
        } else {
            for (int q = 0; q < p; q++)
                if (g->grads[q] == gid) {
                    gid = emit1(&A, OP_IDENTITY, gid, param->loc, name);
                    break;
                }
        }
        ir_value *gv = g->values[gid];
        gv->role = ROLE_GRAD;
        gv->name = name;
        gv->param_index = p;
        g->grads[p] = gid;
    }
    free(needs);
    free(A.grad);
    return A.errors;
}
