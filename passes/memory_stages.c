/* memory_stages.c: the memory plan of pipeline stages (memory_plan_stages) and the
 * layouts of one rank's regions that follow from it: where a value is on a stage or a
 * rank (dm_offset_on, dm_offset_on_rank) and the update's layout. passes/memory.c plans
 * one rank's arena; this file plans it stage by stage with the same placement.
 *
 * Each stage's ranks hold their own regions. Parameters: those the stage's ops use, in
 * declaration order (a parameter tied across stages is held by each; its own stage, the
 * first, updates it). Gradients and optimizer state: those of the parameters it updates.
 * Arena: placed by liveness (mem_place_buffers) over the stage's own sequence of definitions, phase by
 * phase: the values it receives in that phase (all at the phase function's start), then
 * its ops in program order. A value it computes is placed at its definition; one it
 * receives at its phase's start; either dies after its last reader on this stage. The
 * step's loss and outputs on their stage are read at the end of its forward function:
 * those live to the end of the phase. A micro-batch's partial gradient dies where it is
 * added to the step's sum (dm_summed_partials). */
#include <stdlib.h>
#include <string.h>

#include "memory_internal.h"

typedef struct stage_item {
    int id;          /* the value (a storage root) */
    int def;         /* position of its definition on this stage (a receive: its own) */
    int dies;        /* position of its last reader on this stage (>= def) */
    int made_at_create; /* by create, before any step: a working buffer that is never a
                         * micro-batch's (one copy, or one in each copy of the whole arena) */
} stage_item;

/* Copies of values on stages other than their own, collected as triples, then sorted by
 * value into the plan's copy_first/copy_stage/copy_offset. */
typedef struct copy_list {
    int *id, *stage;
    int64_t *offset;
    int n, cap;
} copy_list;

static void add_copy(copy_list *c, int id, int stage, int64_t offset) {
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 64;
        c->id = realloc(c->id, (size_t)c->cap * sizeof(int));
        c->stage = realloc(c->stage, (size_t)c->cap * sizeof(int));
        c->offset = realloc(c->offset, (size_t)c->cap * sizeof(int64_t));
        if (!c->id || !c->stage || !c->offset) abort();
    }
    c->id[c->n] = id, c->stage[c->n] = stage, c->offset[c->n] = offset;
    c->n++;
}

/* Whether an item is one of the forward's values the backward reads: defined (or received)
 * by the end of the forward function, alive after it. */
static int is_kept(const stage_item *item, int forward_end) {
    return !item->made_at_create && item->def <= forward_end && item->dies > forward_end;
}

/* Places the items of one part of a stage's arena (kept: 1 the kept ones, 0 the others, -1
 * every item) by liveness; their offsets into offset[], the part's size returned. */
static int64_t place_items(const ir_graph *g, const stage_item *items, int n_items, int forward_end, int kept,
                           int64_t *offset) {
    int64_t *size = calloc((size_t)n_items + 1, sizeof(int64_t)), *at = calloc((size_t)n_items + 1, sizeof(int64_t));
    int *def = calloc((size_t)n_items + 1, sizeof(int)), *dies = calloc((size_t)n_items + 1, sizeof(int));
    int *which = calloc((size_t)n_items + 1, sizeof(int));
    if (!size || !at || !def || !dies || !which) abort();
    int n = 0;
    for (int it = 0; it < n_items; it++) {
        if (kept >= 0 && is_kept(&items[it], forward_end) != kept) continue;
        which[n] = it;
        size[n] = mem_round_up(ir_storage_elems(g, g->values[items[it].id]));
        def[n] = items[it].def, dies[n] = items[it].dies;
        n++;
    }
    int64_t total = mem_place_buffers(n, size, def, dies, at);
    for (int k = 0; k < n; k++) offset[which[k]] = at[k];
    free(size);
    free(at);
    free(def);
    free(dies);
    free(which);
    return total;
}

/* The arena of stage s: items (received values and the stage's own arena values) in
 * definition order, each freed after its last reader on this stage (place_buffers). */
static void plan_stage_arena(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe, int s,
                             const int *summed, copy_list *copies) {
    int n = g->n_values;
    stage_item *items = malloc(((size_t)n + 1) * sizeof *items);
    int *pos_of = malloc(((size_t)n + 1) * sizeof(int));   /* an op's position on this stage, or -1 */
    int *item_of = malloc(((size_t)n + 1) * sizeof(int));  /* a root's item on this stage, or -1 */
    if (!items || !pos_of || !item_of) abort();
    int n_items = 0, pos = 0, phase_end[3] = {-1, -1, -1};
    for (int i = 0; i < n; i++) pos_of[i] = item_of[i] = -1;
    const ir_phase phases[3] = {PHASE_FORWARD, PHASE_BACKWARD, PHASE_UPDATE};
    /* f = -1: the values made at create (passes/hoist_constants.c), before any step */
    int create_end = -1;
    for (int f = -1; f < 3; f++) {
        for (int i = 0; f >= 0 && i < n; i++) {
            const ir_value *v = g->values[i];
            int received = plan->region[i] == REGION_ARENA && plan->storage_of[i] == i && v->stage != s &&
                           v->phase == phases[f] && v->stage < 64 && (pipe->readers[i] >> s & 1);
            if (!received) continue;
            item_of[i] = n_items;
            items[n_items++] = (stage_item){.id = i, .def = pos, .dies = pos};
            pos++;
        }
        for (int i = 0; i < n; i++) {
            const ir_value *v = g->values[i];
            int made_at_create = dm_made_at_create(plan, i);
            if ((f < 0 ? !made_at_create : made_at_create || v->phase != phases[f]) || v->stage != s ||
                ir_op_info_of(v->op)->cls == OPC_SOURCE)
                continue;
            pos_of[i] = pos;
            /* a buffer is live from the first value written into it (a window
             * assembly's first piece comes before its sum) */
            int root = plan->storage_of[i];
            if (plan->region[i] == REGION_ARENA && item_of[root] < 0 && g->values[root]->stage == s &&
                (f < 0 || g->values[root]->phase == phases[f])) {
                item_of[root] = n_items;
                items[n_items++] = (stage_item){.id = root, .def = pos, .dies = pos, .made_at_create = made_at_create};
            }
            pos++;
        }
        if (f < 0) create_end = pos - 1;
        else phase_end[f] = pos - 1;
    }
    /* last readers on this stage; a micro-batch's partial gradient is added to the step's
     * sum where it is computed (the position of the value, a view's included) */
    for (int i = 0; i < n; i++) {
        if (pos_of[i] < 0) continue;
        const ir_value *v = g->values[i];
        int own = summed[i] >= 0 ? item_of[plan->storage_of[i]] : -1;
        if (own >= 0 && items[own].dies < pos_of[i]) items[own].dies = pos_of[i];
        for (int k = 0; k < v->n_operands; k++) {
            int it = item_of[plan->storage_of[v->operands[k]]];
            if (it >= 0 && items[it].dies < pos_of[i] && mem_read_keeps_alive(summed, v, k)) items[it].dies = pos_of[i];
        }
        for (const ir_value *also = mem_operands_also_read(plan, g, v); also; also = mem_operands_also_read(plan, g, also))
            for (int k = 0; k < also->n_operands; k++) {
                int it = item_of[plan->storage_of[also->operands[k]]];
                if (it >= 0 && items[it].dies < pos_of[i]) items[it].dies = pos_of[i];
            }
    }
    /* made at create and read in a step: alive through every step */
    for (int it = 0; it < n_items; it++)
        if (items[it].made_at_create && items[it].dies > create_end) items[it].dies = pos;
    /* read at the end of the forward function: the loss and outputs */
    for (int q = -1; q < g->n_outputs; q++) {
        int id = q < 0 ? g->loss : g->outputs[q];
        int it = id >= 0 ? item_of[plan->storage_of[id]] : -1;
        if (it >= 0 && items[it].dies < phase_end[0]) items[it].dies = phase_end[0];
    }

    dm_stage_memory *sm = &plan->stage[s];
    int64_t *offset = calloc((size_t)n_items + 1, sizeof(int64_t));
    if (!offset) abort();
    for (int it = 0; it < n_items; it++) sm->arena_unshared_elems += mem_round_up(ir_storage_elems(g, g->values[items[it].id]));
    sm->in_flight = pipe->stage && s < pipe->stages && pipe->stage[s].in_flight > 1 ? pipe->stage[s].in_flight : 1;
    sm->arena_elems = place_items(g, items, n_items, phase_end[0], -1, offset);
    sm->kept_elems = sm->in_flight > 1 ? sm->arena_elems : 0; /* the whole arena copied */
    if (sm->in_flight > 1) {
        /* or the working buffers first, then the forward's values the backward reads: kept
         * when smaller (a stage whose working buffers are small can hold less as one) */
        int64_t *split = calloc((size_t)n_items + 1, sizeof(int64_t));
        if (!split) abort();
        int64_t working = place_items(g, items, n_items, phase_end[0], 0, split);
        int64_t kept = place_items(g, items, n_items, phase_end[0], 1, split);
        if (working + kept * sm->in_flight < sm->arena_elems * sm->in_flight) {
            for (int it = 0; it < n_items; it++) offset[it] = split[it] + (is_kept(&items[it], phase_end[0]) ? working : 0);
            sm->arena_elems = working + kept;
            sm->kept_elems = kept;
        }
        free(split);
    }
    sm->held_elems = sm->arena_elems + (int64_t)(sm->in_flight - 1) * sm->kept_elems;
    for (int it = 0; it < n_items; it++) {
        int id = items[it].id;
        if (g->values[id]->stage == s) plan->offset[id] = offset[it];
        else add_copy(copies, id, s, offset[it]);
    }
    free(offset);
    free(items);
    free(pos_of);
    free(item_of);
}

/* The persistent regions of every stage: parameters (each holder's copy of a tied one),
 * gradients and state on their own stage, in declaration order. */
static void plan_stage_persistent(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe,
                                  copy_list *copies) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        int64_t size = mem_round_up(ir_local_numel(g, &v->type));
        if (plan->region[i] == REGION_PARAMS || plan->region[i] == REGION_GRADS) size = dm_persistent_elems(g, ir_local_numel(g, &v->type));
        /* a value sharing a buffer is placed with it (below, in memory_plan_stages) */
        if (v->stage >= plan->stages || plan->storage_of[i] != i) continue;
        dm_stage_memory *own = &plan->stage[v->stage];
        switch (plan->region[i]) {
        case REGION_PARAMS: {
            plan->offset[i] = own->param_elems;
            own->param_elems += size;
            /* a copy on each other rank reading it, in the first of its stages that does */
            uint64_t others = v->stage < 64 ? pipe->readers[plan->storage_of[i]] & ~((uint64_t)1 << v->stage) : 0;
            uint64_t ranks_held = (uint64_t)1 << dm_rank_of_stage(pipe, v->stage);
            for (int s = 0; s < plan->stages && s < 64; s++)
                if ((others >> s & 1) && !(ranks_held >> dm_rank_of_stage(pipe, s) & 1)) {
                    ranks_held |= (uint64_t)1 << dm_rank_of_stage(pipe, s);
                    add_copy(copies, i, s, plan->stage[s].param_elems);
                    plan->stage[s].param_elems += size;
                }
            break;
        }
        case REGION_GRADS:
            plan->offset[i] = own->grad_elems;
            own->grad_elems += size;
            break;
        case REGION_STATE:
            plan->offset[i] = own->state_elems;
            own->state_elems += size;
            break;
        default: break;
        }
    }
}

_Static_assert(REGION_GRADS == REGION_PARAMS + 1 && REGION_STATE == REGION_PARAMS + 2 && REGION_ARENA == REGION_PARAMS + 3,
               "stack_chunks numbers the regions from params");

/* Interleaved, a rank holds its chunks' stages: each region of the rank is theirs one after
 * the other (chunk 0's first), and every offset, a copy's too, moves to where its stage's
 * part starts in its rank's region. Without chunks the parts start at 0. */
static void stack_chunks(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe, copy_list *copies) {
    int S = plan->stages;
    int64_t *base = calloc((size_t)S * 4 + 1, sizeof(int64_t)); /* per stage: params, grads, state, arena */
    if (!base) abort();
    for (int r = 0; r < pipe->ranks; r++) {
        int64_t at[4] = {0};
        for (int k = r; k < S; k += pipe->ranks) {
            dm_stage_memory *m = &plan->stage[k];
            const int64_t size[4] = {m->param_elems, m->grad_elems, m->state_elems, m->held_elems};
            for (int q = 0; q < 4; q++) base[4 * k + q] = at[q], at[q] += size[q];
            m->arena_base = base[4 * k + 3];
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        int k = g->values[i]->stage, q = plan->region[i] - REGION_PARAMS;
        if (plan->storage_of[i] == i && k >= 0 && k < S && q >= 0 && q < 4) plan->offset[i] += base[4 * k + q];
    }
    for (int c = 0; c < copies->n; c++) {
        int q = plan->region[copies->id[c]] - REGION_PARAMS;
        if (q >= 0 && q < 4) copies->offset[c] += base[4 * copies->stage[c] + q];
    }
    free(base);
}

/* What each rank holds: the sums of its stages' regions (without chunks, its stage's: no
 * table of its own, as ZeRO changes the stages' sizes later). */
static void sum_ranks(dm_memory_plan *plan, const dm_pipeline_plan *pipe) {
    plan->ranks = pipe->ranks;
    if (pipe->chunks <= 1) return;
    plan->rank = calloc((size_t)plan->ranks, sizeof *plan->rank);
    if (!plan->rank) abort();
    for (int k = 0; k < plan->stages; k++) {
        const dm_stage_memory *m = &plan->stage[k];
        dm_stage_memory *r = &plan->rank[dm_rank_of_stage(pipe, k)];
        r->param_elems += m->param_elems, r->grad_elems += m->grad_elems, r->state_elems += m->state_elems;
        r->grad_sum_elems += m->grad_sum_elems ? m->grad_sum_elems : m->grad_elems;
        r->arena_unshared_elems += m->arena_unshared_elems;
        /* the rank's arena is its stages' held regions, each its own; one micro-batch's is
         * their arenas' */
        r->arena_elems += m->arena_elems, r->held_elems += m->held_elems;
        if (m->in_flight > r->in_flight) r->in_flight = m->in_flight;
    }
}

void memory_plan_stages(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe) {
    if (pipe->stages <= 1 || !pipe->readers) return;
    int n = g->n_values;
    plan->stages = pipe->stages;
    plan->stage = calloc((size_t)plan->stages, sizeof *plan->stage);
    plan->copy_first = calloc((size_t)n + 2, sizeof(int));
    if (!plan->stage || !plan->copy_first) abort();
    copy_list copies = {0};
    plan_stage_persistent(plan, g, pipe, &copies);
    int *summed = dm_summed_partials(g);
    for (int s = 0; s < plan->stages; s++) plan_stage_arena(plan, g, pipe, s, summed, &copies);
    free(summed);
    if (pipe->chunks > 1) stack_chunks(plan, g, pipe, &copies);
    /* a sharing reshape is where its root is */
    for (int i = 0; i < n; i++)
        if (plan->storage_of[i] != i) plan->offset[i] = plan->offset[plan->storage_of[i]] + plan->within[i];
    /* the copies by value (counting sort; stages ascending within a value, as added) */
    for (int k = 0; k < copies.n; k++) plan->copy_first[copies.id[k] + 1]++;
    for (int i = 0; i < n; i++) plan->copy_first[i + 1] += plan->copy_first[i];
    plan->copy_stage = malloc(((size_t)copies.n + 1) * sizeof(int));
    plan->copy_offset = malloc(((size_t)copies.n + 1) * sizeof(int64_t));
    int *fill = malloc(((size_t)n + 1) * sizeof(int));
    if (!plan->copy_stage || !plan->copy_offset || !fill) abort();
    memcpy(fill, plan->copy_first, (size_t)n * sizeof(int));
    for (int k = 0; k < copies.n; k++) {
        int at = fill[copies.id[k]]++;
        plan->copy_stage[at] = copies.stage[k];
        plan->copy_offset[at] = copies.offset[k];
    }
    free(fill);
    free(copies.id);
    free(copies.stage);
    free(copies.offset);
    /* what the largest rank holds */
    sum_ranks(plan, pipe);
    plan->param_elems = plan->grad_elems = plan->state_elems = plan->arena_elems = plan->arena_unshared_elems = 0;
    for (int s = 0; s < plan->ranks; s++) {
        const dm_stage_memory *m = dm_rank_memory(plan, s);
        if (m->param_elems > plan->param_elems) plan->param_elems = m->param_elems;
        if (m->grad_elems > plan->grad_elems) plan->grad_elems = m->grad_elems;
        if (m->state_elems > plan->state_elems) plan->state_elems = m->state_elems;
        if (m->arena_elems > plan->arena_elems) plan->arena_elems = m->arena_elems;
        if (m->arena_unshared_elems > plan->arena_unshared_elems) plan->arena_unshared_elems = m->arena_unshared_elems;
    }
}


/* Operand k of update op v (parameter, gradient, the state tensors, a pruning mask last)
 * when it is its gradient or a state tensor, or -1. */
static int update_operand(const ir_graph *g, const ir_value *v, int k) {
    if (ir_op_info_of(v->op)->cls != OPC_UPDATE) return -1;
    int mask = g->values[v->operands[v->n_operands - 1]]->prune_mask;
    return k >= 1 && k < v->n_operands - mask ? v->operands[k] : -1;
}

/* The buffers of `region` anew: operand `first` of every update in the updates' order,
 * then operand first + 1 of every one, ... up to operand `last`; each of the region's
 * `elems` elements as before (sizes by `padded`), the values sharing a buffer moved with
 * it. Where a buffer of the region is no update's, the plan stays. */
static void relayout_by_update(dm_memory_plan *plan, const ir_graph *g, dm_region region, int first, int last, int64_t elems,
                               int64_t (*padded)(const ir_graph *g, int64_t numel)) {
    int n = g->n_values, buffers = 0, placed = 0;
    int64_t *at = malloc(((size_t)n + 1) * sizeof(int64_t)), top = 0;
    if (!at) abort();
    for (int i = 0; i < n; i++) {
        at[i] = -1;
        buffers += plan->region[i] == region && plan->storage_of[i] == i;
    }
    for (int k = first; k <= last; k++)
        for (int i = 0; i < n; i++) {
            int b = update_operand(g, g->values[i], k);
            if (b < 0 || plan->region[b] != region || plan->storage_of[b] != b || at[b] >= 0) continue;
            at[b] = top;
            top += padded(g, ir_local_numel(g, &g->values[b]->type));
            placed++;
        }
    if (placed == buffers && top == elems)
        for (int i = 0; i < n; i++)
            if (at[plan->storage_of[i]] >= 0) plan->offset[i] = at[plan->storage_of[i]] + plan->within[i];
    free(at);
}

static int64_t state_padded(const ir_graph *g, int64_t numel) {
    (void)g;
    return mem_round_up(numel);
}

void memory_update_layout(dm_memory_plan *plan, const ir_graph *g) {
    if (plan->stages > 1 || g->zero || g->param_servers.servers) return;
    /* several ranks reduce gradients in buckets of the backward pass's order: kept */
    for (int a = 0; a < g->n_axes; a++)
        if (g->axes[a].size > 1) return;
    relayout_by_update(plan, g, REGION_GRADS, 1, 1, plan->grad_elems, dm_persistent_elems);
    relayout_by_update(plan, g, REGION_STATE, 2, 5, plan->state_elems, state_padded);
}

int64_t dm_offset_on(const dm_memory_plan *plan, const ir_graph *g, int id, int stage) {
    int root = plan->storage_of[id];
    if (plan->stages <= 1 || stage < 0 || g->values[root]->stage == stage) return plan->offset[root] + plan->within[id];
    if (plan->region[root] == REGION_PARAMS) return dm_offset_on_rank(plan, g, id, mem_rank_of(plan, stage));
    for (int k = plan->copy_first[root]; k < plan->copy_first[root + 1]; k++)
        if (plan->copy_stage[k] == stage) return plan->copy_offset[k] + plan->within[id];
    return -1;
}

int64_t dm_offset_on_rank(const dm_memory_plan *plan, const ir_graph *g, int id, int rank) {
    int root = plan->storage_of[id];
    if (plan->stages <= 1 || mem_rank_of(plan, g->values[root]->stage) == rank) return plan->offset[root] + plan->within[id];
    for (int k = plan->copy_first[root]; k < plan->copy_first[root + 1]; k++)
        if (mem_rank_of(plan, plan->copy_stage[k]) == rank) return plan->copy_offset[k] + plan->within[id];
    return -1;
}


/* The micro-batches' sum of each tied partial (ir_value.tied_partial_of: a tied parameter's
 * partial gradient made on a rank other than its owner's) sits after its rank's gradient
 * sums, which grow by it: that rank adds each micro-batch's partial there and sends the sum
 * once a step (codegen/emit_step.c). */
void memory_plan_tied_sums(dm_memory_plan *plan, const ir_graph *g) {
    for (int i = 0; plan->stages > 1 && i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!v->tied_partial_of) continue;
        if (!plan->partial_sum_offset) {
            plan->partial_sum_offset = malloc(((size_t)g->n_values + 1) * sizeof(int64_t));
            if (!plan->partial_sum_offset) abort();
            for (int k = 0; k < g->n_values; k++) plan->partial_sum_offset[k] = -1;
        }
        int r = mem_rank_of(plan, v->stage);
        dm_stage_memory *m = plan->rank ? &plan->rank[r] : &plan->stage[r];
        int64_t at = m->grad_sum_elems ? m->grad_sum_elems : m->grad_elems;
        plan->partial_sum_offset[i] = at;
        m->grad_sum_elems = at + mem_round_up(ir_local_numel(g, &v->type));
        int64_t largest = plan->grad_sum_elems ? plan->grad_sum_elems : plan->grad_elems;
        if (m->grad_sum_elems > largest) plan->grad_sum_elems = m->grad_sum_elems;
    }
}
