/* zero_gather.c: ZeRO 3's gathers. With g->zero == 3 a rank keeps only its share of each
 * gradient bucket's parameters (passes/zero.c lays the shares out), so the graph reads a
 * bucket's parameters from a whole copy gathered for the purpose: before the first op of
 * the forward pass that reads any of them, a zero_gather op all-gathers the bucket's flat
 * range into the arena, and each member becomes a param_view of it; the backward pass
 * gathers the range again for its own readers. Liveness (passes/memory.c) frees each
 * gathered range after its last reader, so a rank holds the whole of only the buckets in
 * use. Prefetch: the gather of the bucket the pass reaches next (on the same stage) is
 * placed right after the current bucket's views, so that its communication overlaps the
 * current bucket's computation (the gather is started; its first view waits for it).
 *
 * The range is laid out as passes/memory.c lays out the bucket's parameters (and
 * gradients): in declaration order, each rounded up by dm_persistent_elems, so a
 * parameter's offset in the gathered range is its offset in the gradient range the
 * update reduce-scatters.
 *
 * A bucket stays whole (as under ZeRO 2) when a member is read on another pipeline stage
 * than its own (a tied parameter: its copies are kept whole on each stage).
 *
 * requires: optimizer, shard, pipeline (stages); run before memory. Moves every param
 * value to the front of the graph (a prefetch may read parameters declared later). */
#include <stdlib.h>

#include "passes.h"

typedef struct insertion {
    int before;      /* the op (old id) it goes in front of */
    int bucket;      /* index into the bucket list */
    int view_of;     /* -1: the bucket's gather; else the member parameter (index) viewed */
    ir_phase phase;
    int seq;         /* its place in the planned order (ties at one position keep it) */
} insertion;

typedef struct zero_group {
    int first, last;   /* parameters [first, last] */
    int axis, stage;
    int64_t span;
    int64_t *at;       /* (last - first + 1) each member's offset in the range */
    int first_reader[2]; /* forward, backward: the first op reading a member (old id), or -1 */
} zero_group;

/* The buckets of passes/buckets.c whose members are read only on their own stage. */
static int find_groups(const ir_graph *g, int64_t bucket_floats, zero_group **out) {
    dm_bucket_plan plan;
    pass_buckets(g, NULL, bucket_floats, &plan);
    /* the parameters some op reads on another stage than theirs (tied ones) */
    char *elsewhere = calloc((size_t)g->n_params + 1, 1);
    if (!elsewhere) abort();
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands && v->phase != PHASE_UPDATE; k++) {
            const ir_value *o = g->values[v->operands[k]];
            if (o->op == OP_PARAM && v->stage != o->stage) elsewhere[o->param_index] = 1;
        }
    }
    int n = 0;
    zero_group *groups = NULL;
    /* a bucket is a run of consecutive parameters with one lead (passes/buckets.c) */
    for (int first = 0, last; first < g->n_params; first = last + 1) {
        int lead = g->grads[first] >= 0 ? plan.lead[g->grads[first]] : -1;
        int own_stage = !elsewhere[first];
        for (last = first; last + 1 < g->n_params && lead >= 0 && g->grads[last + 1] >= 0 && plan.lead[g->grads[last + 1]] == lead;)
            own_stage &= !elsewhere[++last];
        if (lead < 0 || !own_stage) continue;
        zero_group z = {.first = first, .last = last, .axis = g->values[lead]->mesh_axis,
                        .stage = g->values[g->params[first]]->stage, .first_reader = {-1, -1}};
        z.at = malloc(((size_t)(last - first) + 1) * sizeof(int64_t));
        if (!z.at) abort();
        int64_t end = 0, k = g->axes[z.axis].size;
        for (int p = first; p <= last; p++) {
            int64_t numel = ir_local_numel(g, &g->values[g->params[p]]->type);
            z.at[p - first] = end;
            z.span = end + numel;
            end += dm_persistent_elems(g, numel);
        }
        /* the last member's elements, rounded to a multiple of k, end the range (passes/zero.c) */
        z.span = (z.span + k - 1) / k * k;
        groups = ir_grow(groups, n, sizeof *groups);
        groups[n++] = z;
    }
    dm_bucket_plan_free(&plan);
    free(elsewhere);
    *out = groups;
    return n;
}

/* A group and its first reader in a phase, sorted by the reader (then the group). */
typedef struct reached {
    int reader, group;
} reached;

static int compare_reached(const void *a, const void *b) {
    const reached *x = a, *y = b;
    if (x->reader != y->reader) return x->reader < y->reader ? -1 : 1;
    return x->group < y->group ? -1 : x->group > y->group;
}

/* The insertions of one phase: the gathers and views of every group it reads, in the
 * order the pass reaches them, each next gather prefetched. */
static int plan_phase(const zero_group *groups, int n_groups, int phase, insertion *ins, int n_ins) {
    reached *by_reader = malloc(((size_t)n_groups + 1) * sizeof *by_reader);
    int *order = malloc(((size_t)n_groups + 1) * sizeof(int)), n = 0;
    char *started = calloc((size_t)n_groups + 1, 1);
    if (!by_reader || !order || !started) abort();
    for (int b = 0; b < n_groups; b++)
        if (groups[b].first_reader[phase] >= 0) by_reader[n++] = (reached){groups[b].first_reader[phase], b};
    qsort(by_reader, (size_t)n, sizeof *by_reader, compare_reached);
    for (int k = 0; k < n; k++) order[k] = by_reader[k].group;
    free(by_reader);
    ir_phase ph = phase ? PHASE_BACKWARD : PHASE_FORWARD;
    for (int k = 0; k < n; k++) {
        const zero_group *z = &groups[order[k]];
        int at = z->first_reader[phase];
        if (!started[order[k]]) ins[n_ins++] = (insertion){at, order[k], -1, ph, 0};
        for (int p = z->first; p <= z->last; p++) ins[n_ins++] = (insertion){at, order[k], p, ph, 0};
        if (k + 1 < n && groups[order[k + 1]].stage == z->stage) {
            ins[n_ins++] = (insertion){at, order[k + 1], -1, ph, 0};
            started[order[k + 1]] = 1;
        }
    }
    free(order);
    free(started);
    return n_ins;
}

static int compare_insertions(const void *a, const void *b) {
    const insertion *x = a, *y = b;
    if (x->before != y->before) return x->before < y->before ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The op insertion x makes before `reader` (old ids; map: old to new): its group's gather
 * (gathered[2 group + phase] set) or a member's view of it (view[2 param + phase] set). */
static ir_value *make_insertion(ir_graph *g, ir_value *const *old, const int *map, const zero_group *groups,
                                const insertion *x, const ir_value *reader, int *gathered, int *view) {
    const zero_group *z = &groups[x->bucket];
    int phase = x->phase == PHASE_BACKWARD;
    ir_value *nv;
    if (x->view_of < 0) {
        int members = z->last - z->first + 1, *operands = malloc((size_t)members * sizeof(int));
        if (!operands) abort();
        for (int p = z->first; p <= z->last; p++) operands[p - z->first] = map[g->params[p]];
        nv = ir_add(g, OP_ZERO_GATHER, operands, members, reader->loc);
        free(operands);
        nv->type.dtype = DT_F32;
        nv->type.rank = 1;
        nv->type.shape[0] = z->span;
        nv->mesh_axis = z->axis;
        nv->name = ir_internf(g, "%s.bucket%s", old[g->params[z->first]]->name, phase ? ".again" : "");
        gathered[2 * x->bucket + phase] = nv->id;
    } else {
        int p = x->view_of, gather = gathered[2 * x->bucket + phase];
        const ir_value *param = old[g->params[p]];
        nv = ir_add(g, OP_PARAM_VIEW, &gather, 1, reader->loc);
        nv->type = param->type;
        nv->offset = z->at[p - z->first];
        nv->param_index = p;
        nv->name = ir_internf(g, "%s.%s", param->name, phase ? "regathered" : "gathered");
        view[2 * p + phase] = nv->id;
    }
    nv->role = ROLE_TEMP;
    nv->phase = x->phase;
    nv->stage = z->stage;
    nv->origin = reader->origin;
    return nv;
}

/* Each group's first reader in the forward and in the backward (first_reader[phase]). */
static void find_first_readers(const ir_graph *g, zero_group *groups, int n_groups) {
    int n = g->n_values;
    int *group_of_value = malloc(((size_t)n + 1) * sizeof(int));
    if (!group_of_value) abort();
    for (int i = 0; i < n; i++) group_of_value[i] = -1;
    for (int b = 0; b < n_groups; b++)
        for (int p = groups[b].first; p <= groups[b].last; p++) group_of_value[g->params[p]] = b;
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[i];
        if (v->phase == PHASE_UPDATE) continue;
        int phase = v->phase == PHASE_BACKWARD;
        for (int k = 0; k < v->n_operands; k++) {
            int b = group_of_value[v->operands[k]];
            if (b >= 0 && groups[b].first_reader[phase] < 0) groups[b].first_reader[phase] = i;
        }
    }
    free(group_of_value);
}

int pass_zero_gather(ir_graph *g, int64_t bucket_floats, dm_pipeline_plan *pipe, dm_reshard_list *reshards) {
    if (g->zero < 3 || !g->grads || g->optimizer.kind == OPTIM_NONE) return 0;
    zero_group *groups = NULL;
    int n_groups = find_groups(g, bucket_floats, &groups), n = g->n_values;
    if (!n_groups) return 0;
    find_first_readers(g, groups, n_groups);
    /* every member viewed and every group gathered, twice at most */
    int cap = 0;
    for (int b = 0; b < n_groups; b++) cap += 2 * (groups[b].last - groups[b].first + 2);
    insertion *ins = malloc(((size_t)cap + 1) * sizeof *ins);
    if (!ins) abort();
    int n_ins = plan_phase(groups, n_groups, 0, ins, 0);
    n_ins = plan_phase(groups, n_groups, 1, ins, n_ins);
    /* by position, and in the planned order at one position */
    for (int k = 0; k < n_ins; k++) ins[k].seq = k;
    qsort(ins, (size_t)n_ins, sizeof *ins, compare_insertions);

    /* the new list: parameters first, then every op preceded by its insertions */
    ir_value **old = g->values;
    int *map = malloc(((size_t)n + 1) * sizeof(int));
    int *gathered = malloc(((size_t)n_groups * 2 + 1) * sizeof(int));   /* (group, phase) -> new id */
    int *view = malloc(((size_t)g->n_params * 2 + 1) * sizeof(int));    /* (param, phase) -> new id */
    if (!map || !gathered || !view) abort();
    for (int k = 0; k < 2 * g->n_params; k++) view[k] = -1;
    g->values = NULL;
    g->n_values = g->cap_values = 0;
    for (int i = 0; i < n; i++)
        if (old[i]->op == OP_PARAM) {
            ir_append_value(g, old[i]);
            map[i] = old[i]->id;
        }
    int next = 0;
    for (int i = 0; i < n; i++) {
        for (; next < n_ins && ins[next].before == i; next++)
            make_insertion(g, old, map, groups, &ins[next], old[i], gathered, view);
        ir_value *v = old[i];
        if (v->op == OP_PARAM) continue;
        int phase = v->phase == PHASE_BACKWARD;
        for (int k = 0; k < v->n_operands; k++) {
            int o = v->operands[k];
            int p = old[o]->op == OP_PARAM ? old[o]->param_index : -1;
            v->operands[k] = v->phase != PHASE_UPDATE && p >= 0 && view[2 * p + phase] >= 0 ? view[2 * p + phase] : map[o];
        }
        ir_append_value(g, v);
        map[i] = v->id;
    }
    free(old);
    ir_renumber_lists(g, map);
    dm_plans_renumber(map, pipe, reshards);
    for (int b = 0; b < n_groups; b++) free(groups[b].at);
    free(groups);
    free(ins);
    free(map);
    free(gathered);
    free(view);
    return 0;
}

char *dm_zero_gathered_params(const ir_graph *g) {
    char *in_shares = NULL;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ZERO_GATHER) continue;
        if (!in_shares && !(in_shares = calloc((size_t)g->n_params + 1, 1))) abort();
        for (int k = 0; k < v->n_operands; k++) {
            int p = g->values[v->operands[k]]->param_index;
            if (p >= 0 && p < g->n_params) in_shares[p] = 1;
        }
    }
    return in_shares;
}
