/* recompute.c: activation recomputation. A segment is the forward values of one call of
 * a layer at the top level (a transformer block: ir_value.segment). Of a recomputed
 * segment, the backward pass reads only what crosses its boundary (its inputs, and the
 * values later segments or the top level read: the next block's input); every other
 * value the backward reads is computed again, by a copy of the ops that made it, placed
 * just before the first backward op that needs one of them. The originals then die when
 * the forward pass is done with them, and the memory plan's liveness, --explain and the
 * pipeline cut's activation count see it with no rule of their own. The copies are the
 * same ops on the same operands, so the step's results are bitwise those without.
 *
 * Which values (g->recompute): MARKED, those of segments made inside recompute(...);
 * FULL, every segment's; SELECTIVE, every segment's values that are cheap to make again
 * (elementwise, softmax, norms, reshapes: not products or fused attention, which keep
 * their outputs);
 * NONE, nothing. Never a value computed from numbers alone (a RoPE table): it is made
 * once at create and kept (passes/hoist_constants.c).
 *
 * requires: autodiff (before optimizer and shard, which insert the collectives the
 * copies need like any op's); renumbers values. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int cheap(const ir_value *v) {
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_MATMUL:
    case OPC_ATTENTION: /* products too, and what it keeps is small */
    case OPC_GATHER:
    case OPC_COLLECTIVE:
    case OPC_LOSS:
        return 0;
    default:
        return 1;
    }
}

/* Whether forward value v may be made again in the backward pass. */
static int recomputable(const ir_graph *g, const ir_value *v) {
    if (v->phase != PHASE_FORWARD || v->role != ROLE_TEMP || v->segment <= 0) return 0;
    if (ir_op_info_of(v->op)->cls == OPC_SOURCE) return 0;
    switch (g->recompute) {
    case RECOMPUTE_MARKED: return v->marked;
    case RECOMPUTE_FULL: return 1;
    case RECOMPUTE_SELECTIVE: return cheap(v);
    default: return 0;
    }
}

int pass_recompute(ir_graph *g, dm_diag *d) {
    (void)d;
    int n = g->n_values;
    if (g->recompute == RECOMPUTE_NONE || !g->grads) return 0;
    char *candidate = calloc((size_t)n + 1, 1), *needed = calloc((size_t)n + 1, 1);
    int *clone = malloc(((size_t)n + 1) * sizeof(int)), *insert_at = malloc(((size_t)n + 1) * sizeof(int));
    if (!candidate || !needed || !clone || !insert_at) abort();
    /* values made at create (passes/hoist_constants.c) live through the step already */
    char *constant = dm_constant_values(g);
    for (int i = 0; i < n; i++) candidate[i] = (char)(recomputable(g, g->values[i]) && !constant[i]);
    free(constant);
    /* the boundary stays: values read by forward ops of another segment, outputs, the loss */
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (g->values[v->operands[k]]->segment != v->segment) candidate[v->operands[k]] = 0;
    }
    for (int i = 0; i < g->n_outputs; i++) candidate[g->outputs[i]] = 0;
    if (g->loss >= 0) candidate[g->loss] = 0;
    /* what the backward reads of them: made again before its first reader */
    int segments = 0;
    for (int i = 0; i < n; i++)
        if (g->values[i]->segment > segments) segments = g->values[i]->segment;
    int *first_reader = malloc(((size_t)segments + 1) * sizeof(int));
    if (!first_reader) abort();
    for (int s = 0; s <= segments; s++) first_reader[s] = -1;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_BACKWARD) continue;
        for (int k = 0; k < v->n_operands; k++) {
            int o = v->operands[k];
            if (!candidate[o]) continue;
            needed[o] = 1;
            int s = g->values[o]->segment;
            if (first_reader[s] < 0) first_reader[s] = i;
        }
    }
    /* a needed value's recomputable operands of its segment are needed too (forward order
     * runs the other way: walk down) */
    for (int i = n - 1; i >= 0; i--) {
        if (!needed[i]) continue;
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++)
            if (candidate[v->operands[k]] && g->values[v->operands[k]]->segment == v->segment) needed[v->operands[k]] = 1;
    }
    int copies = 0;
    for (int i = 0; i < n; i++) {
        clone[i] = -1;
        insert_at[i] = needed[i] ? first_reader[g->values[i]->segment] : -1;
        copies += needed[i];
    }
    if (!copies) goto done;
    /* the new order: every backward op, preceded by the copies it is the insertion point of */
    ir_value **old = g->values;
    int *map = malloc(((size_t)n + 1) * sizeof(int)), *head = malloc(((size_t)n + 1) * sizeof(int)),
        *next = malloc(((size_t)n + 1) * sizeof(int));
    if (!map || !head || !next) abort();
    /* the copies to insert before op i, in forward order: head[i], next[...] */
    for (int i = 0; i < n; i++) head[i] = -1;
    for (int j = n - 1; j >= 0; j--)
        if (insert_at[j] >= 0) {
            next[j] = head[insert_at[j]];
            head[insert_at[j]] = j;
        }
    g->values = NULL;
    g->n_values = g->cap_values = 0;
    for (int i = 0; i < n; i++) {
        for (int j = head[i]; j >= 0; j = next[j]) {
            const ir_value *src = old[j];
            ir_value *c = ir_add(g, src->op, src->operands, src->n_operands, src->loc);
            int *operands = c->operands, id = c->id;
            *c = *src;
            c->operands = operands;
            c->id = id;
            for (int k = 0; k < c->n_operands; k++) {
                int o = src->operands[k];
                c->operands[k] = clone[o] >= 0 ? clone[o] : map[o];
            }
            c->phase = PHASE_BACKWARD;
            c->origin = old[j];
            c->recomputed = 1;
            c->name = src->name ? ir_internf(g, "%s.recomputed", src->name) : NULL;
            clone[j] = c->id;
        }
        ir_value *v = old[i];
        for (int k = 0; k < v->n_operands; k++) {
            int o = v->operands[k];
            v->operands[k] = v->phase == PHASE_BACKWARD && clone[o] >= 0 ? clone[o] : map[o];
        }
        ir_append_value(g, v);
        map[i] = v->id;
    }
    free(old);
    free(head);
    free(next);
    ir_renumber_lists(g, map);
    free(map);
done:
    free(first_reader);
    free(candidate);
    free(needed);
    free(clone);
    free(insert_at);
    return 0;
}
