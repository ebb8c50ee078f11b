/* fuse_attention.c: softmax(causal_mask(q @ transpose(k) / c)) @ v, the attention of
 * examples/gpt.dm, becomes one attention op (ir/ops.def). Lowering has already made the
 * middle one op (a causal softmax with its scale), so the pattern is three ops:
 *
 *   s = matmul(q, k) trans_b, batched over all but the last two dims
 *   p = softmax(s) along the last dim, scaled, causal or not
 *   o = matmul(p, v), batched alike
 *
 * with q, k and v f32 of one shape (..., T, D), and s and p read by nothing else: not the
 * loss, an output, a value whose sharding the .dm annotates or a pipeline cut the .dm
 * names (a dropout on p, or p returned, keeps the three ops). The attention's kernel
 * works on blocks of queries and keys with an online softmax, so a step holds tiles of the
 * scores instead of the B x NH x T x T scores and probabilities; its gradient (autodiff)
 * is one fused backward that keeps only each row's log-sum-exp from the forward.
 *
 * The C target only (the driver sets g->fuse_attention; --no-fuse-attention clears it):
 * the CUDA dialect has no attention kernel.
 *
 * requires: the typed forward graph, before autodiff; leaves an attention in place of
 * each second product, at its position, with its name's layer path and the softmax's
 * line; the two ops before it gone; renumbers values. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int same_shape(const ir_type *a, const ir_type *b) {
    if (a->rank != b->rank || a->dtype != b->dtype) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* A product batched over every dim but the last two, as attention's are. */
static int batched_product(const ir_value *v, int trans_b) {
    return v->op == OP_MATMUL && !v->trans_a && v->trans_b == trans_b && v->type.rank >= 2 &&
           v->batch_dims == v->type.rank - 2;
}

/* Whether the program names v itself: the loss, an output, a sharding or a cut. */
static int named_by_program(const ir_graph *g, const ir_value *v) {
    if (v->id == g->loss || v->annotated) return 1;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v->id) return 1;
    for (int k = 0; k < g->n_cuts; k++)
        if (g->cut_after[k] == v) return 1;
    return 0;
}

/* The softmax of o = matmul(softmax(matmul(q, k)), v) when o is the pattern, else NULL. */
static const ir_value *attention_softmax(const ir_graph *g, const ir_value *o, const int *readers) {
    if (!batched_product(o, 0)) return NULL;
    const ir_value *p = g->values[o->operands[0]];
    if (p->op != OP_SOFTMAX || p->axis != p->type.rank - 1 || readers[p->id] != 1 || named_by_program(g, p)) return NULL;
    const ir_value *s = g->values[p->operands[0]];
    if (!batched_product(s, 1) || readers[s->id] != 1 || named_by_program(g, s)) return NULL;
    const ir_type *q = &g->values[s->operands[0]]->type, *k = &g->values[s->operands[1]]->type;
    const ir_type *v = &g->values[o->operands[1]]->type;
    if (q->dtype != DT_F32 || !same_shape(q, k) || !same_shape(q, v)) return NULL;
    return p;
}

/* "h.0.attn.attention" for the product "h.0.attn.matmul": the layer path kept. */
static const char *attention_name(ir_graph *g, const ir_value *o) {
    if (!o->name) return NULL;
    const char *dot = strrchr(o->name, '.');
    if (!dot) return ir_intern(g, "attention");
    return ir_internf(g, "%.*s.attention", (int)(dot - o->name), o->name);
}

int pass_fuse_attention(ir_graph *g) {
    if (!g->fuse_attention) return 0;
    int n = g->n_values;
    int *readers = calloc((size_t)n + 1, sizeof(int)), *map = malloc(((size_t)n + 1) * sizeof(int));
    const ir_value **softmax_of = calloc((size_t)n + 1, sizeof *softmax_of);
    char *dropped = calloc((size_t)n + 1, 1);
    if (!readers || !map || !softmax_of || !dropped) abort();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->values[i]->n_operands; k++) readers[g->values[i]->operands[k]]++;
    int fused = 0;
    for (int i = 0; i < n; i++) {
        const ir_value *p = attention_softmax(g, g->values[i], readers);
        if (!p) continue;
        softmax_of[i] = p;
        dropped[p->id] = dropped[p->operands[0]] = 1;
        fused++;
    }
    if (fused) {
        ir_value **old = g->values;
        g->values = NULL;
        g->n_values = g->cap_values = 0;
        for (int i = 0; i < n; i++) {
            ir_value *v = old[i];
            map[i] = -1;
            if (dropped[i]) continue;
            for (int k = 0; k < v->n_operands; k++) v->operands[k] = map[v->operands[k]];
            if (!softmax_of[i]) {
                ir_append_value(g, v);
                map[i] = v->id;
                continue;
            }
            const ir_value *p = softmax_of[i], *s = old[p->operands[0]];
            int qkv[3] = {map[s->operands[0]], map[s->operands[1]], v->operands[1]};
            ir_value *a = ir_add(g, OP_ATTENTION, qkv, 3, p->loc);
            a->name = attention_name(g, v);
            a->phase = v->phase;
            a->segment = v->segment;
            a->marked = v->marked;
            a->annotated = v->annotated;
            a->scalar = p->scalar;
            a->causal = p->causal;
            a->type = v->type;
            for (int k = 0; k < g->n_cuts; k++)
                if (g->cut_after[k] == v) g->cut_after[k] = a;
            map[i] = a->id;
        }
        free(old);
        ir_renumber_lists(g, map);
    }
    free(readers);
    free(map);
    free(softmax_of);
    free(dropped);
    return 0;
}
