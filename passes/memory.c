/* memory.c: the static memory plan of one rank (sizes are the rank's shards). requires: the final graph; leaves the
 * graph untouched and fills a dm_memory_plan.
 *
 * Persistent values (params, grads, optimizer state) are laid out in declaration order,
 * so that each region is one contiguous block (a later ZeRO pass shards it by ranges).
 * Temporaries share one arena: a value is placed in the first free range that holds it
 * (first fit over the ranges freed by dead values, else at the top). Offsets are rounded to
 * 16 elements (64 bytes) for vector loads. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define ALIGN_ELEMS 16

static int64_t round_up(int64_t n) { return (n + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS; }

/* Free ranges of the arena below its top, sorted by offset and never adjacent. Real
 * models keep few of them, so a sorted array is enough. */
typedef struct gap_list {
    int64_t *offset, *size;   /* (n) */
    int n;
    int64_t top;              /* everything at or above is free */
} gap_list;

static void remove_gap(gap_list *f, int k) {
    memmove(f->offset + k, f->offset + k + 1, (size_t)(f->n - k - 1) * sizeof(int64_t));
    memmove(f->size + k, f->size + k + 1, (size_t)(f->n - k - 1) * sizeof(int64_t));
    f->n--;
}

static int64_t take(gap_list *f, int64_t size) {
    for (int k = 0; k < f->n; k++) {
        if (f->size[k] < size) continue;
        int64_t at = f->offset[k];
        f->offset[k] += size;
        f->size[k] -= size;
        if (f->size[k] == 0) {
            remove_gap(f, k);
        }
        return at;
    }
    int64_t at = f->top;
    f->top += size;
    return at;
}

static void give_back(gap_list *f, int64_t at, int64_t size) {
    int k = 0;
    while (k < f->n && f->offset[k] < at) k++;
    /* merge with the gap before and the one after */
    if (k > 0 && f->offset[k - 1] + f->size[k - 1] == at) {
        k--;
        at = f->offset[k];
        size += f->size[k];
        remove_gap(f, k);
    }
    if (k < f->n && at + size == f->offset[k]) {
        size += f->size[k];
        remove_gap(f, k);
    }
    if (at + size == f->top) {
        f->top = at;
        return;
    }
    memmove(f->offset + k + 1, f->offset + k, (size_t)(f->n - k) * sizeof(int64_t));
    memmove(f->size + k + 1, f->size + k, (size_t)(f->n - k) * sizeof(int64_t));
    f->offset[k] = at;
    f->size[k] = size;
    f->n++;
}

int pass_memory(const ir_graph *g, dm_memory_plan *plan) {
    int n = g->n_values;
    memset(plan, 0, sizeof *plan);
    plan->region = calloc((size_t)n + 1, sizeof(dm_region));
    plan->offset = calloc((size_t)n + 1, sizeof(int64_t));
    plan->storage_of = calloc((size_t)n + 1, sizeof(int));
    int *last_use = calloc((size_t)n + 1, sizeof(int));
    if (!plan->region || !plan->offset || !plan->storage_of || !last_use) abort();

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

    /* dies_head[i]: the arena buffers whose last reader is op i, linked through dies_next */
    int *dies_head = malloc(((size_t)n + 1) * sizeof(int)), *dies_next = malloc(((size_t)n + 1) * sizeof(int));
    gap_list free_list = {.offset = malloc(((size_t)n + 1) * sizeof(int64_t)), .size = malloc(((size_t)n + 1) * sizeof(int64_t))};
    if (!dies_head || !dies_next || !free_list.offset || !free_list.size) abort();
    for (int i = 0; i <= n; i++) dies_head[i] = -1;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        int64_t size = round_up(ir_local_numel(g, &v->type));
        /* Buffers whose last reader ran before this op are free again; the operands of
         * this op are still live, so its result never overlaps them. */
        if (i > 0)
            for (int k = dies_head[i - 1]; k >= 0; k = dies_next[k])
                give_back(&free_list, plan->offset[k], round_up(ir_local_numel(g, &g->values[k]->type)));
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
        plan->region[i] = REGION_ARENA;
        plan->offset[i] = take(&free_list, size);
        int dies = last_use[i] < n ? last_use[i] : n;
        dies_next[i] = dies_head[dies];
        dies_head[dies] = i;
        if (plan->offset[i] + size > plan->arena_elems) plan->arena_elems = plan->offset[i] + size;
        plan->arena_unshared_elems += size;
    }
    free(dies_head);
    free(dies_next);
    free(free_list.offset);
    free(free_list.size);
    free(last_use);
    return 0;
}

void dm_memory_plan_free(dm_memory_plan *plan) {
    free(plan->region);
    free(plan->offset);
    free(plan->storage_of);
    memset(plan, 0, sizeof *plan);
}
