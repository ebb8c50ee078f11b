/* memory.c: the static memory plan of one rank. requires: the final graph; leaves the
 * graph untouched and fills a dm_memory_plan.
 *
 * Persistent values (params, grads, optimizer state) are laid out in declaration order,
 * so that each region is one contiguous block (a later ZeRO pass shards it by ranges).
 * Temporaries share one arena: a value is placed at the lowest offset that does not
 * overlap any value still live when it is defined (first fit). Offsets are rounded to
 * 16 elements (64 bytes) for vector loads. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define ALIGN_ELEMS 16

static int64_t round_up(int64_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

typedef struct live_block {
    int64_t offset, size;
    int until;   /* index of the last op that reads it */
} live_block;

static int by_offset(const void *a, const void *b) {
    const live_block *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

int pass_memory(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    memset(plan, 0, sizeof *plan);
    plan->region = calloc((size_t)n + 1, sizeof(dm_region));
    plan->offset = calloc((size_t)n + 1, sizeof(int64_t));
    plan->storage_of = calloc((size_t)n + 1, sizeof(int));
    int *last_use = calloc((size_t)n + 1, sizeof(int));
    live_block *live = calloc((size_t)n + 1, sizeof(live_block));
    if (!plan->region || !plan->offset || !plan->storage_of || !last_use || !live) abort();

    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        /* a temporary reshape shares its operand's buffer; a reshape with a buffer of
         * its own (a parameter's gradient) is a copy */
        plan->storage_of[i] = v->op == OP_RESHAPE && v->role == ROLE_TEMP ? plan->storage_of[v->operands[0]] : i;
        last_use[i] = i;
    }
    /* liveness of a buffer: the last read of it or of any reshape sharing it */
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++) {
            int s = plan->storage_of[v->operands[k]];
            if (last_use[s] < i) last_use[s] = i;
        }
    }
    for (int i = 0; i < g->n_outputs; i++) last_use[plan->storage_of[g->outputs[i]]] = n;
    if (g->loss >= 0) last_use[plan->storage_of[g->loss]] = n;
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i && last_use[i] > last_use[plan->storage_of[i]])
            last_use[plan->storage_of[i]] = last_use[i];

    int n_live = 0;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        int64_t size = round_up(ir_numel(&v->type));
        switch (v->role) {
        case ROLE_CONST: plan->region[i] = REGION_NONE; continue;
        case ROLE_INPUT: plan->region[i] = REGION_INPUT; continue;
        case ROLE_PARAM:
            plan->region[i] = REGION_PARAMS;
            plan->offset[i] = plan->param_elems;
            plan->param_elems += size;
            continue;
        case ROLE_GRAD:
            plan->region[i] = REGION_GRADS;
            plan->offset[i] = plan->grad_elems;
            plan->grad_elems += size;
            continue;
        case ROLE_STATE:
            plan->region[i] = REGION_STATE;
            plan->offset[i] = plan->state_elems;
            plan->state_elems += size;
            continue;
        case ROLE_TEMP: break;
        }
        if (v->type.dtype == DT_VOID) {
            plan->region[i] = REGION_NONE;
            continue;
        }
        if (plan->storage_of[i] != i) {
            int root = plan->storage_of[i];
            plan->region[i] = plan->region[root];
            plan->offset[i] = plan->offset[root];
            continue;
        }
        /* drop blocks whose last reader ran before this op */
        int kept = 0;
        for (int k = 0; k < n_live; k++)
            if (live[k].until >= i) live[kept++] = live[k];
        n_live = kept;
        qsort(live, (size_t)n_live, sizeof *live, by_offset);
        int64_t at = 0;
        for (int k = 0; k < n_live; k++) {
            if (live[k].offset - at >= size) break;
            if (live[k].offset + live[k].size > at) at = live[k].offset + live[k].size;
        }
        plan->region[i] = REGION_ARENA;
        plan->offset[i] = at;
        live[n_live++] = (live_block){.offset = at, .size = size, .until = last_use[i]};
        if (at + size > plan->arena_elems) plan->arena_elems = at + size;
        plan->arena_unshared_elems += size;
    }
    free(last_use);
    free(live);
    return 0;
}

void dm_memory_plan_free(dm_memory_plan *plan) {
    free(plan->region);
    free(plan->offset);
    free(plan->storage_of);
    memset(plan, 0, sizeof *plan);
}
