/* prune_heads.c: the attention heads of `--prune RATIO:rows` (docs/compression.md,
 * "Attention heads"). An attention's q, k and v are each the output of a product with a
 * weight, split by a reshape into [.., heads, HS], and its output, merged back by a reshape
 * into [.., heads * HS], is the left operand of the output projection. Traced back from
 * each attention (the fused op, or softmax(q @ k^T ..) @ v) to those reshapes and the
 * products, a head is HS output channels of the q, k and v weights and HS input rows of the
 * projection's. With grouped-query attention (fewer k/v heads than q heads, a kv head
 * serving R consecutive query heads, as Hugging Face's repeat_kv) the unit is a kv group:
 * a k/v head and its R query heads, HS channels of k and v, R * HS of q and the projection.
 * Where the structure is not recognised, the attention gets a note why and its weights
 * stay per channel. requires: the forward graph (reads only forward ops). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int cls(const ir_value *v) { return ir_op_info_of(v->op)->cls; }

const ir_value *prune_heads_only_reader(const ir_graph *g, const ir_value *v) {
    const ir_value *found = NULL;
    for (int i = v->id + 1; i < g->n_values; i++) {
        const ir_value *u = g->values[i];
        if (u->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < u->n_operands; k++)
            if (u->operands[k] == v->id) {
                if (found && found != u) return NULL;
                found = u;
            }
    }
    return found;
}

/* A reshape of [.., D] into [.., NH, HS] (NH * HS = D, the leading dims kept). */
static int splits_heads(const ir_graph *g, const ir_value *v) {
    if (v->op != OP_RESHAPE) return 0;
    const ir_type *a = &g->values[v->operands[0]]->type, *r = &v->type;
    if (r->rank != a->rank + 1 || r->shape[r->rank - 2] * r->shape[r->rank - 1] != a->shape[a->rank - 1]) return 0;
    for (int d = 0; d < a->rank - 1; d++)
        if (a->shape[d] != r->shape[d]) return 0;
    return 1;
}

/* The weight that product p reads as its right operand: the parameter, read directly (stored
 * [IN, OUT], or [OUT, IN] transposed), through a transpose op, or as a reshape of a slice of
 * a fused parameter along a dim other than its last (gpt.dm's q | k | v). Sets *out_axis and
 * *in_axis: the parameter's dims of the product's output channels and input rows (in_axis
 * -1 for a slice). Returns the parameter's id, or -1. */
static int product_weight(const ir_graph *g, const ir_value *p, int *out_axis, int *in_axis) {
    if (p->op != OP_MATMUL || p->trans_a || p->batch_dims) return -1;
    const ir_value *b = g->values[p->operands[1]];
    int trans = p->trans_b;
    if (b->op == OP_TRANSPOSE && b->type.rank == 2 && b->perm[0] == 1) trans = !trans, b = g->values[b->operands[0]];
    if (b->op == OP_PARAM && b->type.rank == 2) {
        *out_axis = trans ? 0 : 1;
        *in_axis = trans ? 1 : 0;
        return b->id;
    }
    if (b->op != OP_RESHAPE || trans || b->type.rank != 2) return -1;
    const ir_value *s = g->values[b->operands[0]];
    if (s->op != OP_SLICE) return -1;
    const ir_value *w = g->values[s->operands[0]];
    if (w->op != OP_PARAM || s->axis == w->type.rank - 1 || w->type.shape[w->type.rank - 1] != b->type.shape[1] ||
        ir_numel(&s->type) != ir_numel(&b->type))
        return -1;
    *out_axis = w->type.rank - 1;
    *in_axis = -1;
    return w->id;
}

/* From x, an operand of the attention, back to the reshape that split its heads (through
 * transposes, reshapes and broadcasts of the heads, RoPE's elementwise ops: the first
 * operand each time), then to the product whose output it split (a bias added or not).
 * Fills the member's weight and the heads' count and size; returns a reason or NULL. */
static const char *trace_projection(const ir_graph *g, int x, int *param, int *axis, int64_t *heads, int64_t *hs,
                                    int *split, int *product) {
    const ir_value *v = g->values[x];
    while (!splits_heads(g, v)) {
        int c = cls(v);
        if (v->n_operands < 1 || v->op == OP_MATMUL || v->op == OP_SOFTMAX ||
            !(c == OPC_TRANSPOSE || c == OPC_RESHAPE || c == OPC_BROADCAST || c == OPC_BINARY || c == OPC_UNARY || c == OPC_CAST))
            return "q, k or v does not come from a reshape into [.., heads, head size]";
        v = g->values[v->operands[0]];
    }
    *heads = v->type.shape[v->type.rank - 2];
    *hs = v->type.shape[v->type.rank - 1];
    *split = v->id;
    const ir_value *p = g->values[v->operands[0]];
    if (p->op == OP_ADD) {
        const ir_value *a = g->values[p->operands[0]], *b = g->values[p->operands[1]];
        p = a->op == OP_MATMUL ? a : b;
    }
    int in_axis;
    *product = p->id;
    *param = product_weight(g, p, axis, &in_axis);
    if (*param < 0) return "the heads are not split from a product with a weight (x @ W, a slice of a fused W)";
    if (g->values[*param]->type.shape[*axis] != *heads * *hs) return "a weight's channels are not the heads' elements";
    return NULL;
}

/* From the attention's output o forward, through transposes, to the reshape merging its
 * heads, whose only reader must be a product with a weight: its input rows are the heads'. */
static const char *trace_output(const ir_graph *g, const ir_value *o, int64_t heads, int64_t hs, int *param, int *axis,
                                int *merge) {
    const ir_value *v = prune_heads_only_reader(g, o);
    while (v && v->op == OP_TRANSPOSE) v = prune_heads_only_reader(g, v);
    if (!v || v->op != OP_RESHAPE) return "the heads' output is not merged by a reshape read once";
    const ir_type *a = &g->values[v->operands[0]]->type;
    if (v->type.rank != a->rank - 1 || a->shape[a->rank - 2] != heads || a->shape[a->rank - 1] != hs ||
        v->type.shape[v->type.rank - 1] != heads * hs)
        return "the merged heads are not [.., heads * head size]";
    *merge = v->id;
    const ir_value *p = prune_heads_only_reader(g, v);
    int out_axis;
    if (!p || p->operands[0] != v->id || (*param = product_weight(g, p, &out_axis, axis)) < 0 || *axis < 0)
        return "the merged heads are not read by one product with a weight (the output projection)";
    return NULL;
}

/* q, k and v of an attention: the fused op's operands, or softmax(..(q @ k^T)..) @ v. */
static int attention_operands(const ir_graph *g, const ir_value *v, int qkv[3]) {
    if (v->phase != PHASE_FORWARD) return 0;
    if (v->op == OP_ATTENTION) {
        memcpy(qkv, v->operands, 3 * sizeof *qkv);
        return 1;
    }
    if (v->op != OP_MATMUL || v->trans_b || v->type.rank < 3 || v->batch_dims != v->type.rank - 2) return 0;
    const ir_value *p = g->values[v->operands[0]];
    if (p->op != OP_SOFTMAX) return 0;
    while (p->op != OP_MATMUL && p->n_operands >= 1 && (cls(p) != OPC_SOURCE)) p = g->values[p->operands[0]];
    if (p->op != OP_MATMUL || !p->trans_b || p->batch_dims != p->type.rank - 2) return 0;
    qkv[0] = p->operands[0], qkv[1] = p->operands[1], qkv[2] = v->operands[1];
    return 1;
}

/* Adds a member, or checks it against the same parameter's earlier one. */
static const char *add_member(prune_head_group *h, int param, int axis, int64_t unit) {
    for (int i = 0; i < h->n_members; i++)
        if (h->members[i].param == param)
            return h->members[i].axis == axis && h->members[i].unit == unit ? NULL
                                                                             : "a fused weight holds parts of other head layouts";
    if (h->n_members == PRUNE_HEAD_MEMBERS) return "more weights than q, k, v and the projection";
    h->members[h->n_members++] = (prune_head_member){param, axis, unit};
    return NULL;
}

static const char *trace_attention(const ir_graph *g, const ir_value *att, const int qkv[3], prune_head_group *h) {
    int param[3], axis[3];
    int64_t heads[3], hs[3];
    for (int i = 0; i < 3; i++) {
        const char *why = trace_projection(g, qkv[i], &param[i], &axis[i], &heads[i], &hs[i], &h->split[i], &h->product[i]);
        if (why) return why;
    }
    if (hs[0] != hs[1] || hs[1] != hs[2] || heads[1] != heads[2] || heads[0] % heads[1])
        return "q, k and v have different head sizes, or k and v's heads do not divide q's";
    int64_t r = heads[0] / heads[1];
    h->units = heads[1], h->q_heads = heads[0], h->head_size = hs[0];
    int out_param, out_axis;
    const char *why = trace_output(g, att, heads[0], hs[0], &out_param, &out_axis, &h->merge);
    if (!why) why = add_member(h, param[0], axis[0], r * hs[0]);
    if (!why) why = add_member(h, param[1], axis[1], hs[0]);
    if (!why) why = add_member(h, param[2], axis[2], hs[0]);
    if (!why) why = add_member(h, out_param, out_axis, r * hs[0]);
    return why;
}

/* Whether another group found before holds one of h's weights. */
static int shares_weight(const prune_head_group *groups, int n, const prune_head_group *h) {
    for (int i = 0; i < n; i++)
        for (int a = 0; a < groups[i].n_members; a++)
            for (int b = 0; b < h->n_members; b++)
                if (groups[i].members[a].param == h->members[b].param) return 1;
    return 0;
}

prune_head_group *prune_heads_find(const ir_graph *g, int *n_found) {
    int n = 0, qkv[3];
    for (int i = 0; i < g->n_values; i++) n += attention_operands(g, g->values[i], qkv);
    prune_head_group *groups = calloc((size_t)(n ? n : 1), sizeof *groups);
    if (!groups) abort();
    n = 0;
    for (int i = 0; i < g->n_values; i++) {
        if (!attention_operands(g, g->values[i], qkv)) continue;
        prune_head_group *h = &groups[n];
        memset(h, 0, sizeof *h);
        h->attention = i;
        h->why = trace_attention(g, g->values[i], qkv, h);
        if (!h->why && shares_weight(groups, n, h)) h->why = "its weights are another attention's too";
        if (h->why) h->n_members = 0;
        n++;
    }
    *n_found = n;
    return groups;
}
