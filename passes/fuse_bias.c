/* fuse_bias.c: a bias's add that runs its product (pass_memory's bias_add_of: the product's
 * C is filled with the bias, beta 1), whose first reader is an activation of it alone (a
 * unary op of one expression, same phase and stage, f32, as many elements, its own
 * buffer): the product is made without the bias, and the activation's pass adds the
 * bias, stores the sum (the activation's gradient reads it) and applies itself, one pass
 * where there were two (the bias's fill, the activation). Where the target's loop nests can
 * (can.bias_activation: both dialects'; the driver asks codegen_fuses_bias). requires:
 * memory. leaves: the graph
 * unchanged; the plan is plan->activation_of. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* A bias's add sharing its product's buffer runs that product. */
static int runs_product(const dm_memory_plan *mem, const ir_value *v) {
    return v->op == OP_ADD && mem->bias_add_of[v->operands[0]] == v->id;
}

/* Elements of value id as one rank holds it. */
static int64_t local_numel(const ir_graph *g, int id) {
    ir_type t = ir_local_type(g, &g->values[id]->type);
    return ir_numel(&t);
}

void pass_fuse_bias(const ir_graph *g, const dm_memory_plan *mem, int enabled, dm_bias_plan *plan) {
    plan->activation_of = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!plan->activation_of) abort();
    for (int i = 0; i < g->n_values; i++) plan->activation_of[i] = -1;
    if (!enabled) return;
    for (int a = 0; a < g->n_values; a++) {
        const ir_value *add = g->values[a];
        /* the bias is read later than the add would read it: only a parameter's own storage
         * keeps it that long (a slice, a ZeRO 3 gather, is a temporary) */
        if (!runs_product(mem, add) || mem->region[mem->storage_of[add->operands[1]]] != REGION_PARAMS) continue;
        for (int u = a + 1; u < g->n_values; u++) {
            const ir_value *reader = g->values[u];
            int reads = 0;
            for (int k = 0; k < reader->n_operands; k++) reads |= reader->operands[k] == a;
            if (!reads) continue;
            const ir_op_info *info = ir_op_info_of(reader->op);
            if (info->cls == OPC_UNARY && reader->n_operands == 1 && reader->op != OP_DROPOUT && info->forward &&
                !strchr(info->forward, ';') && reader->phase == add->phase && reader->stage == add->stage &&
                mem->storage_of[u] == u && reader->type.dtype == DT_F32 && local_numel(g, u) == local_numel(g, a))
                plan->activation_of[a] = u;
            break; /* the first reader decides */
        }
    }
}

void dm_bias_plan_free(dm_bias_plan *plan) {
    free(plan->activation_of);
    plan->activation_of = NULL;
}
