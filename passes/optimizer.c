/* optimizer.c: appends the update of every parameter (phase update) and the optimizer
 * state it keeps (role state, zero at creation); with --prune, a weight matrix's update
 * also takes its pruning mask, last (1 where pruned: zero at creation prunes nothing). A parameter the loss does not reach
 * (passes/trainable.c) gets neither, as torch.optim skips a parameter whose .grad is
 * None: no step, no weight decay. requires: autodiff (g->grads). */
#include <stdlib.h>

#include "passes.h"

static int add_state(ir_graph *g, const ir_value *param, int p, const char *what) {
    ir_value *s = ir_add(g, OP_STATE, NULL, 0, param->loc);
    s->phase = PHASE_UPDATE;
    s->role = ROLE_STATE;
    s->type = param->type;
    s->param_index = p;
    s->name = ir_internf(g, "%s.%s", param->name, what);
    return s->id;
}

/* The value a forward product's operand id reads, through transposes and reshapes. */
static const ir_value *through_layout(const ir_graph *g, int id) {
    const ir_value *a = g->values[id];
    while (a->n_operands == 1 && (ir_op_info_of(a->op)->cls == OPC_TRANSPOSE || ir_op_info_of(a->op)->cls == OPC_RESHAPE))
        a = g->values[a->operands[0]];
    return a;
}

/* Whether a forward op other than a product (or a transpose or reshape on the way to one)
 * reads param_id: an embedding's gather of a GPT's tied head. */
static int read_by_other_ops(const ir_graph *g, int param_id) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD || v->op == OP_MATMUL) continue;
        if (v->n_operands == 1 && (ir_op_info_of(v->op)->cls == OPC_TRANSPOSE || ir_op_info_of(v->op)->cls == OPC_RESHAPE))
            continue;
        for (int k = 0; k < v->n_operands; k++)
            if (through_layout(g, v->operands[k])->id == param_id) return 1;
    }
    return 0;
}

/* A weight matrix --prune prunes: a parameter of two or more dims that forward matrix
 * products read, directly or through transposes and reshapes, and nothing else does (not an
 * embedding's table, which a gather reads, nor a head tied to one; not biases or norms'
 * gains, of one dim). Returns the dim of its output channels (of the product's result: for
 * x @ w its columns' dim, for w @ x its rows'), or -1 when it is not pruned. RATIO:rows
 * prunes only weights every product reads directly and not transposed (trans_a or trans_b
 * on the weight's side, a transpose folded into the product): through a reshape the
 * channels would be another layout's, and a weight read transposed could not be compacted
 * (passes/compact_channels.c keeps it: "read transposed"), so its zeros would stay. */
static int pruned_channels(const ir_graph *g, int param_id) {
    int rank = g->values[param_id]->type.rank, channels = -1;
    if (rank < 2 || read_by_other_ops(g, param_id)) return -1;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_MATMUL || v->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < v->n_operands; k++) {
            if (through_layout(g, v->operands[k])->id != param_id) continue;
            int transposed = k == 0 ? v->trans_a : v->trans_b;
            int dim = k == 1 ? (transposed ? rank - 2 : rank - 1) : (transposed ? rank - 1 : rank - 2);
            if (!g->prune.rows) return dim;
            if (v->operands[k] != param_id || transposed || (channels >= 0 && channels != dim)) return -1;
            channels = dim;
        }
    }
    return channels;
}

/* Under RATIO:rows, the head group (from 1) holding param_id, and its member; 0 for none. */
static int head_group_of(const prune_head_group *groups, int n, int param_id, const prune_head_member **member) {
    for (int i = 0; i < n; i++)
        for (int m = 0; m < groups[i].n_members; m++)
            if (groups[i].members[m].param == param_id) {
                *member = &groups[i].members[m];
                return i + 1;
            }
    return 0;
}

/* The mask of a pruned weight: per channel along dim channels, or (RATIO:rows) with its
 * attention's heads. */
static void add_mask(ir_graph *g, const ir_value *param, int p, int channels, const prune_head_group *groups,
                     int n_groups, int *ops, int *n) {
    const prune_head_member *member = NULL;
    int group = g->prune.rows ? head_group_of(groups, n_groups, param->id, &member) : 0;
    if (channels < 0 && !group) return;
    /* the id first: add_state may grow g->values, which the subscript must not have read before */
    int id = add_state(g, param, p, "prune_mask");
    ops[(*n)++] = id;
    ir_value *mask = g->values[id];
    mask->prune_mask = 1;
    mask->axis = group ? member->axis : channels;
    mask->prune_group = group;
    mask->prune_unit = group ? member->unit : 0;
}

int pass_optimizer(ir_graph *g, dm_diag *d) {
    const ir_optimizer *o = &g->optimizer;
    if (o->kind == OPTIM_NONE || !g->grads) return 0;
    int errors = 0, n_groups = 0;
    prune_head_group *groups = g->prune.ratio > 0 && g->prune.rows ? prune_heads_find(g, &n_groups) : NULL;
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *param = g->values[g->params[p]];
        if (param->unreached) continue;
        int ops[5] = {param->id, g->grads[p], -1, -1, -1};
        int n = 2;
        ir_op op;
        if (o->kind == OPTIM_SGD) {
            op = OP_SGD_UPDATE;
            if (o->momentum != 0) ops[n++] = add_state(g, param, p, "momentum_buffer");
        } else {
            op = OP_ADAMW_UPDATE;
            ops[n++] = add_state(g, param, p, "exp_avg");
            ops[n++] = add_state(g, param, p, "exp_avg_sq");
        }
        if (g->prune.ratio > 0) add_mask(g, param, p, pruned_channels(g, param->id), groups, n_groups, ops, &n);
        ir_value *u = ir_add(g, op, ops, n, o->loc);
        u->phase = PHASE_UPDATE;
        u->param_index = p;
        u->name = ir_internf(g, "%s.update", param->name);
        errors += shapes_infer(g, u, d);
    }
    free(groups);
    return errors;
}
