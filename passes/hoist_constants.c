/* hoist_constants.c: the values made once, when the context is created. A value computed
 * from numbers alone (arange's counting, a RoPE table: no input, parameter, state or random
 * draw reaches it) is the same in every step, so the generated create computes it and the
 * step only reads it: the memory planner gives it a buffer that no step value shares
 * (passes/memory.c), and code generation emits its op in a function create calls instead
 * of in the step's (codegen/emit_step.c). Such a value gets no gradient (autodiff makes
 * none for what depends on no parameter), is no parameter and is in no weight file or
 * checkpoint. On a mesh each rank computes its own shard of it: the sharding pass has
 * already partitioned its ops; on a pipeline the stage whose ops read it makes it. */
#include <stdlib.h>

#include "passes.h"

/* Whether op v, given operands made at create, can run there too: a kernel of its own that
 * reads and writes only its buffers (no collective, no random draw, no loss or update, no
 * gather by ids, no view into another op's buffer). */
static int runs_at_create(const ir_value *v) {
    /* (the backward's constants come from the loss's gradient seed, which loss scaling
     * changes from step to step; recomputed copies read what the forward made) */
    if (v->role != ROLE_TEMP || v->type.dtype == DT_VOID || v->phase != PHASE_FORWARD) return 0;
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_UNARY: return v->op != OP_DROPOUT;
    case OPC_RESHAPE: return v->op == OP_RESHAPE;
    case OPC_BINARY: case OPC_REDUCE: case OPC_BROADCAST: case OPC_TRANSPOSE: case OPC_MATMUL:
    case OPC_SOFTMAX: case OPC_MASK: case OPC_SLICE: case OPC_CAST:
        return 1;
    default: return 0;
    }
}

/* Clears at[i] where a rule no longer holds: an operand (not a number spelled inline) that
 * is not made at create; a buffer shared with a value that is not (a view, a bias's add, a
 * window assembly's pieces: all of a buffer's values are made in one place). Returns
 * whether anything changed. */
static int drop_broken(const ir_graph *g, const dm_memory_plan *plan, char *at) {
    int changed = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; at[i] && k < v->n_operands; k++)
            if (!at[v->operands[k]] && g->values[v->operands[k]]->op != OP_CONST) at[i] = 0, changed = 1;
        int root = plan->storage_of[i];
        if (at[i] != at[root]) at[i] = at[root] = 0, changed = 1;
    }
    return changed;
}

char *dm_constant_values(const ir_graph *g) {
    char *at = calloc((size_t)g->n_values + 1, 1);
    if (!at) abort();
    for (int i = 0; i < g->n_values && !g->constants_every_step; i++) {
        const ir_value *v = g->values[i];
        at[i] = (char)runs_at_create(v);
        for (int k = 0; at[i] && k < v->n_operands; k++) {
            const ir_value *x = g->values[v->operands[k]];
            at[i] = (x->role == ROLE_CONST && !x->loss_seed) || at[x->id];
        }
    }
    return at;
}

void dm_plan_at_create(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    char *at = dm_constant_values(g);
    /* the loss and outputs are read after the step, as it made them; a value read on another
     * pipeline stage is sent there in the step (each stage makes the constants its ops read) */
    for (int q = -1; q < g->n_outputs; q++) {
        int id = q < 0 ? g->loss : g->outputs[q];
        if (id >= 0) at[id] = 0;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->values[i]->n_operands; k++)
            if (g->values[g->values[i]->operands[k]]->stage != g->values[i]->stage) at[g->values[i]->operands[k]] = 0;
    while (drop_broken(g, plan, at)) {}
    plan->at_create = at;
}

int dm_made_at_create(const dm_memory_plan *plan, int id) { return plan->at_create && plan->at_create[id]; }

char *dm_read_by_steps(const ir_graph *g, const dm_memory_plan *plan) {
    char *read = calloc((size_t)g->n_values + 1, 1);
    if (!read) abort();
    for (int i = 0; i < g->n_values; i++)
        for (int k = 0; !dm_made_at_create(plan, i) && k < g->values[i]->n_operands; k++)
            if (dm_made_at_create(plan, g->values[i]->operands[k])) read[plan->storage_of[g->values[i]->operands[k]]] = 1;
    return read;
}
