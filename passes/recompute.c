/* recompute.c: activation recomputation. A segment is the forward values of one call of
 * a layer at the top level, or of a repeated layer's member inside one (a transformer
 * block: ir_value.segment, ir/lower.c's close_segment). Of a recomputed
 * segment, the backward pass reads only what crosses its boundary (its inputs, and the
 * values later segments or the top level read: the next block's input); every other
 * value the backward reads is computed again, by a copy of the ops that made it, placed
 * just before the first op that reads it (a backward op, or another copy). The originals
 * then die when the forward pass is done with them, and the memory plan's liveness,
 * --explain and the pipeline cut's activation count see it with no rule of their own. The
 * copies are the same ops on the same operands, so the step's results are bitwise those
 * without.
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

/* Which values may be made again in the backward (candidate): recomputable ops, not
 * values made at create, nor a segment's boundary (values read by forward ops of another
 * segment, outputs, the loss). */
static char *recompute_candidates(const ir_graph *g) {
    int n = g->n_values;
    char *candidate = calloc((size_t)n + 1, 1);
    if (!candidate) abort();
    /* values made at create (passes/hoist_constants.c) live through the step already */
    char *constant = dm_constant_values(g);
    for (int i = 0; i < n; i++) candidate[i] = (char)(recomputable(g, g->values[i]) && !constant[i]);
    free(constant);
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (g->values[v->operands[k]]->segment != v->segment) candidate[v->operands[k]] = 0;
    }
    for (int i = 0; i < g->n_outputs; i++) candidate[g->outputs[i]] = 0;
    if (g->loss >= 0) candidate[g->loss] = 0;
    return candidate;
}

/* Where each candidate the backward needs is made again (insert_at: -1 where not
 * needed): what the backward reads of them, and their recomputable operands of the same
 * segment. A copy is made just before the first op that reads it (a backward op, or a
 * copy made from it), not all of a segment's at its first backward reader: a selective
 * plan's copies (a norm's output the weight gradient reads, say) then live only from
 * there to their last reader, not through the whole segment's backward, where together
 * they could hold more than the originals they spare (a pipeline stage's working
 * buffers). Returns how many. */
static int plan_copies(const ir_graph *g, const char *candidate, int *insert_at) {
    int n = g->n_values, copies = 0;
    for (int i = 0; i < n; i++) insert_at[i] = -1;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_BACKWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (candidate[v->operands[k]] && insert_at[v->operands[k]] < 0) insert_at[v->operands[k]] = i;
    }
    /* a copy's operands before it: forward order runs the other way, walk down (a
     * candidate's candidate operands are of its segment: recompute_candidates drops
     * values another segment reads) */
    for (int i = n - 1; i >= 0; i--) {
        if (insert_at[i] < 0) continue;
        const ir_value *v = g->values[i];
        copies++;
        for (int k = 0; k < v->n_operands; k++) {
            int o = v->operands[k];
            if (candidate[o] && (insert_at[o] < 0 || insert_at[o] > insert_at[i])) insert_at[o] = insert_at[i];
        }
    }
    return copies;
}

/* The new order: every backward op preceded by the copies it is the insertion point of
 * (in forward order), the backward reading the copies. */
static void insert_copies(ir_graph *g, const int *insert_at) {
    int n = g->n_values;
    ir_value **old = g->values;
    int *map = malloc(((size_t)n + 1) * sizeof(int)), *head = malloc(((size_t)n + 1) * sizeof(int)),
        *next = malloc(((size_t)n + 1) * sizeof(int)), *clone = malloc(((size_t)n + 1) * sizeof(int));
    if (!map || !head || !next || !clone) abort();
    /* the copies to insert before op i, in forward order: head[i], next[...] */
    for (int i = 0; i < n; i++) head[i] = -1, clone[i] = -1;
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
    free(clone);
    ir_renumber_lists(g, map);
    free(map);
}

int pass_recompute(ir_graph *g, dm_diag *d) {
    (void)d;
    if (g->recompute == RECOMPUTE_NONE || !g->grads) return 0;
    char *candidate = recompute_candidates(g);
    int *insert_at = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!insert_at) abort();
    if (plan_copies(g, candidate, insert_at)) insert_copies(g, insert_at);
    free(candidate);
    free(insert_at);
    return 0;
}
