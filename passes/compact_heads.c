/* compact_heads.c: --compact PRUNED over attention heads (docs/compression.md, "Compacting
 * a row-pruned model"). An attention's head whose elements are all zero in its q, k and v
 * weights' columns and its output projection's rows (as `--prune RATIO:rows` leaves a pruned
 * head: passes/prune_heads.c) is removed: the heads' reshapes get fewer heads, the weights
 * (and q, k, v's biases) lose the head's channels, HS stays. Exact: the projection's rows of
 * a removed head are zero, so what the head computed (its bias's constant values) never
 * reached the output. With grouped-query attention a unit is a kv group (k/v head and its R
 * query heads). Every value between the splits and the attention's products gets fewer
 * heads along the heads' dim, followed through transposes, elementwise ops (RoPE), slices,
 * pads, reshapes and broadcasts (repeat_kv); q, k, v may be completed by a bias (a
 * parameter, or a slice of a fused one). Elsewhere the report says why.
 * requires: lower (called by pass_compact_channels on the file's weights). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int64_t inner_of(const ir_type *t, int axis) {
    int64_t inner = 1;
    for (int d = axis + 1; d < t->rank; d++) inner *= t->shape[d];
    return inner;
}

static void set_dim(ir_value *v, int dim, int64_t size) {
    v->type.shape[dim] = size;
    v->type.dim_name[dim] = NULL;
}

/* A reshape of a slice of a fused parameter (its types preset by lowering): both narrower
 * along their last dim. */
static void narrow_view(ir_graph *g, ir_value *reshape, int64_t size) {
    set_dim(reshape, reshape->type.rank - 1, size);
    ir_value *slice = g->values[reshape->operands[0]];
    if (slice->op == OP_SLICE) set_dim(slice, slice->type.rank - 1, size);
}

/* alive[u] set where param's unit u (channels of dim axis, unit per unit) has a nonzero. */
static void mark_alive(const ir_graph *g, const dm_compaction *c, int param, int axis, int64_t unit, char *alive) {
    const ir_value *p = g->values[param];
    const float *w = c->weights[p->param_index].data;
    int64_t n = ir_numel(&p->type), channels = p->type.shape[axis], inner = inner_of(&p->type, axis);
    for (int64_t i = 0; i < n; i++)
        if (w[i] != 0.0f) alive[(i / inner) % channels / unit] = 1;
}

/* Keeps the channels of param's dim axis whose unit keep marks: its values, its type, and
 * the stored shape (the stored dim holding that axis scaled alike). */
static void gather_units(ir_graph *g, dm_compaction *c, int param, int axis, int64_t unit, const char *keep,
                         int64_t kept) {
    ir_value *p = g->values[param];
    dm_weight *w = &c->weights[p->param_index];
    int64_t n = ir_numel(&p->type), channels = p->type.shape[axis], inner = inner_of(&p->type, axis), k = 0;
    for (int64_t i = 0; i < n; i++)
        if (keep[(i / inner) % channels / unit]) w->data[k++] = w->data[i];
    int64_t after = kept * unit, prefix = ir_numel(&p->type) / inner, seen = 1;
    if (p->stored_rank) {
        for (int d = 0; d < p->stored_rank; d++)
            if ((seen *= p->stored_shape[d]) >= prefix) {
                p->stored_shape[d] = p->stored_shape[d] / channels * after;
                break;
            }
        memcpy(w->shape, p->stored_shape, sizeof w->shape);
    } else {
        w->shape[axis] = after;
    }
    set_dim(p, axis, after);
}

/* The bias completing product i's output before its split (-1: none), and the value the add
 * reads (the parameter, or a reshape of its slice): *view. Returns 0 when not such a bias. */
static int bias_of(const ir_graph *g, const prune_head_group *h, int i, int *param, int *view) {
    const ir_value *a = g->values[g->values[h->split[i]]->operands[0]];
    *param = *view = -1;
    if (a->id == h->product[i]) return 1;
    if (a->op != OP_ADD) return 0;
    const ir_value *b = g->values[a->operands[a->operands[0] == h->product[i] ? 1 : 0]];
    *view = b->id;
    if (b->op == OP_RESHAPE && b->type.rank == 1 && g->values[b->operands[0]]->op == OP_SLICE)
        b = g->values[g->values[b->operands[0]]->operands[0]];
    *param = b->id;
    return b->op == OP_PARAM && b->type.shape[b->type.rank - 1] == g->values[h->split[i]]->type.shape[
        g->values[h->split[i]]->type.rank - 2] * h->head_size;
}

/* Where the heads are in a value between a split of q, k or v and the attention: the dim
 * (-1: not on the path) and how many heads it counts there (more than the split's after
 * repeat_kv merges a kv head with its R copies). */
typedef struct head_dims {
    int *index;
    int64_t *count;
} head_dims;

/* The heads' dim in v's result, from operand a's (dim at, count heads): -1 when v is an op
 * compaction cannot follow or changes the heads. */
static int follow_heads(const ir_value *v, const ir_value *a, int at, int64_t heads, int64_t *count) {
    const ir_type *r = &v->type;
    int out = -1;
    *count = heads;
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_TRANSPOSE:
        for (int i = 0; i < r->rank; i++)
            if (v->perm[i] == at) out = i;
        break;
    case OPC_UNARY: case OPC_CAST: case OPC_BINARY:
        out = at + r->rank - a->type.rank;  /* aligned from the right, as broadcasting */
        break;
    case OPC_BROADCAST:  /* the operand's dims are the result's not in v->axes, in order */
        for (int d = 0, k = 0; d < r->rank && out < 0; d++)
            if (!((v->axes >> d) & 1u) && k++ == at) out = d;
        break;
    case OPC_SLICE:
        out = v->axis == at ? -1 : at;
        break;
    case OPC_RESHAPE: {
        int64_t before = 1, seen = 1;
        for (int d = 0; d < at; d++) before *= a->type.shape[d];
        for (out = 0; out < r->rank && seen < before; out++) seen *= r->shape[out];
        if (seen != before || out >= r->rank || r->shape[out] % heads) return -1;
        *count = r->shape[out];  /* a merge of each head with its copies (repeat_kv) */
        break;
    }
    default:
        return -1;
    }
    return out >= 0 && out < r->rank && r->shape[out] == *count ? out : -1;
}

/* Marks every value from q's, k's and v's splits to the attention's products with its
 * heads' dim; NULL, or why an op on the way cannot be followed. */
static const char *trace_head_dims(const ir_graph *g, const prune_head_group *h, head_dims *p) {
    for (int i = 0; i < 3; i++) {
        const ir_value *split = g->values[h->split[i]];
        p->index[split->id] = split->type.rank - 2;
        p->count[split->id] = split->type.shape[split->type.rank - 2];
    }
    for (int id = 0; id < g->n_values; id++) {
        if (p->index[id] < 0) continue;
        for (int u = id + 1; u < g->n_values; u++) {
            const ir_value *v = g->values[u];
            int reads = 0;
            for (int k = 0; k < v->n_operands; k++) reads |= v->operands[k] == id;
            if (!reads || v->phase != PHASE_FORWARD || v->op == OP_MATMUL || v->op == OP_ATTENTION) continue;
            int64_t count;
            int at = follow_heads(v, g->values[id], p->index[id], p->count[id], &count);
            if (at < 0 || (p->index[u] >= 0 && (p->index[u] != at || p->count[u] != count)))
                return "q, k or v reaches the attention through an op that moves or splits the heads' dim";
            p->index[u] = at, p->count[u] = count;
        }
    }
    return NULL;
}

/* Why group h's heads cannot be removed, or NULL. */
static const char *not_compactable(const ir_graph *g, const prune_head_group *h, head_dims *path) {
    if (h->why) return h->why;
    const char *why = trace_head_dims(g, h, path);
    if (why) return why;
    for (int i = 0; i < 3; i++) {
        int param, view;
        if (!bias_of(g, h, i, &param, &view)) return "q, k or v is completed by more than a bias";
    }
    for (int m = 0; m < h->n_members; m++) {
        const ir_type *t = &g->values[h->members[m].param]->type;
        for (int d = 0; d < t->rank; d++)
            if (t->split[d] != IR_REPLICATED && g->axes[t->split[d]].size > 1)
                return "its weights are split over a mesh axis";
    }
    return NULL;
}

/* Removes the heads keep does not mark from group h's reshapes, weights and biases. */
static void remove_heads(ir_graph *g, dm_compaction *c, const prune_head_group *h, const head_dims *path,
                         const char *keep, int64_t kept) {
    char *done = calloc((size_t)g->n_values, 1);
    if (!done) abort();
    for (int m = 0; m < h->n_members; m++) {
        gather_units(g, c, h->members[m].param, h->members[m].axis, h->members[m].unit, keep, kept);
        done[h->members[m].param] = 1;
    }
    for (int id = 0; id < g->n_values; id++)  /* the preset types (reshapes, slices, broadcasts) */
        if (path->index[id] >= 0) set_dim(g->values[id], path->index[id], kept * (path->count[id] / h->units));
    for (int i = 0; i < 3; i++) {
        ir_value *w = g->values[g->values[h->product[i]]->operands[1]];
        if (w->op == OP_RESHAPE) narrow_view(g, w, kept * h->head_size);
        int param, view;
        bias_of(g, h, i, &param, &view);
        if (param < 0) continue;
        if (view != param) narrow_view(g, g->values[view], kept * h->head_size);
        if (!done[param]) gather_units(g, c, param, g->values[param]->type.rank - 1, h->head_size, keep, kept);
        done[param] = 1;
    }
    ir_value *merge = g->values[h->merge];
    set_dim(merge, merge->type.rank - 1, kept * (h->q_heads / h->units) * h->head_size);
    free(done);
}

/* One attention: its heads removed where it can, and its report line. */
static void compact_group(ir_graph *g, dm_compaction *c, const prune_head_group *h, dm_layer_compaction *line) {
    line->heads = 1;
    line->weight = g->values[h->members[0].param]->name;
    line->weight_id = h->members[0].param;
    line->next_weight = g->values[h->members[h->n_members - 1].param]->name;
    line->before = line->after = h->units;
    head_dims path = {malloc((size_t)g->n_values * sizeof *path.index), malloc((size_t)g->n_values * sizeof *path.count)};
    char *keep = calloc((size_t)h->units, 1);
    if (!path.index || !path.count || !keep) abort();
    for (int id = 0; id < g->n_values; id++) path.index[id] = -1;
    line->why_not = not_compactable(g, h, &path);
    if (line->why_not) {
        free(path.index);
        free(path.count);
        free(keep);
        return;
    }
    for (int m = 0; m < h->n_members; m++)
        mark_alive(g, c, h->members[m].param, h->members[m].axis, h->members[m].unit, keep);
    int64_t kept = 0;
    for (int64_t u = 0; u < h->units; u++) kept += keep[u];
    if (!kept) keep[0] = 1, kept = 1; /* an attention keeps one head */
    if (kept == h->units) line->why_not = "no head is all zero in q, k, v and the projection";
    else remove_heads(g, c, h, &path, keep, kept);
    if (h->units == h->q_heads) snprintf(line->why, sizeof line->why, "attention heads");
    else snprintf(line->why, sizeof line->why, "kv groups (a k/v head and its %lld query heads)",
                  (long long)(h->q_heads / h->units));
    line->after = kept;
    free(path.index);
    free(path.count);
    free(keep);
}

int compact_heads(ir_graph *g, dm_compaction *c, char *listed) {
    int n, compacted = 0;
    prune_head_group *groups = prune_heads_find(g, &n);
    for (int k = 0; k < n; k++) {
        dm_layer_compaction *line = &c->layers[c->n_layers++];
        if (!groups[k].n_members) {
            line->heads = 1;
            line->weight = g->values[groups[k].attention]->name ? g->values[groups[k].attention]->name : "attention";
            line->weight_id = groups[k].attention;
            line->why_not = groups[k].why;
            continue;
        }
        compact_group(g, c, &groups[k], line);
        if (line->why_not) continue;
        compacted++;
        for (int m = 0; m < groups[k].n_members; m++) listed[groups[k].members[m].param] = 1;
    }
    free(groups);
    return compacted;
}
