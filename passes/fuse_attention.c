/* fuse_attention.c: softmax(causal_mask(q @ transpose(k) / c)) @ v, the attention of
 * examples/gpt.dm, becomes one attention op (ir/ops.def). Lowering has already made a
 * causal mask and a scale inside a softmax one op (a causal softmax with its scale), so
 * the pattern is three ops, or four when an unmasked softmax's scores are scaled:
 *
 *   s = matmul(q, k) trans_b, batched over all but the last two dims
 *       [s * c, c * s or s / c, with c a constant]
 *   p = softmax(s) along the last dim, scaled, causal or not
 *   o = matmul(p, v), batched alike
 *
 * with q, k and v f32 of one shape (..., T, D), and each op but o read only by the next
 * and not named by the program: not the loss, an output, a value whose sharding the .dm
 * annotates or a pipeline cut (a dropout on p, or p returned, keeps the ops). The
 * attention's kernel works on blocks of queries and keys with an online softmax, so a
 * step holds tiles of the scores instead of the B x NH x T x T scores and probabilities;
 * its gradient (autodiff) is one fused backward that keeps only each row's log-sum-exp
 * from the forward.
 *
 * Where the target has attention kernels (the driver sets g->fuse_attention;
 * --no-fuse-attention clears it): the C target's blocked kernels (runtime/dmrt_attention.h),
 * the CUDA target's a thread a row in f32 (runtime/cuda/attention.cu) and, under
 * --precision bf16 or fp16, cuDNN's in that type (runtime/cuda/attention16.cu, which casts
 * the f32 operands itself: g->attention_16bit).
 *
 * requires: the typed forward graph, before autodiff; leaves an attention in place of
 * each second product, at its position, named with its layer path and at the softmax's
 * line; the ops before it gone; renumbers values. */
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

/* What an attention fuses: the scores' product, the op scaling them (or NULL), the
 * softmax, and the scale in all. */
typedef struct attention_match {
    const ir_value *scores, *scaling, *softmax;
    double scale;
} attention_match;

/* x * c, c * x or x / c with c a constant: x and the factor; else x = v, factor 1. */
static const ir_value *unscaled(const ir_graph *g, const ir_value *v, double *factor) {
    *factor = 1.0;
    if (v->op != OP_MUL && v->op != OP_DIV) return v;
    const ir_value *a = g->values[v->operands[0]], *b = g->values[v->operands[1]];
    if (b->op == OP_CONST && b->scalar != 0) {
        *factor = v->op == OP_MUL ? b->scalar : 1.0 / b->scalar;
        return a;
    }
    if (v->op == OP_MUL && a->op == OP_CONST) {
        *factor = a->scalar;
        return b;
    }
    return v;
}

/* Whether only the next op of the pattern reads v, and the program does not name it. */
static int inner(const ir_graph *g, const ir_value *v, const int *readers) {
    return readers[v->id] == 1 && !named_by_program(g, v);
}

/* Whether o = matmul(softmax(matmul(q, k) [* c]), v) is the pattern; fills m. */
static int match_attention(const ir_graph *g, const ir_value *o, const int *readers, attention_match *m) {
    if (!batched_product(o, 0)) return 0;
    const ir_value *p = g->values[o->operands[0]];
    if (p->op != OP_SOFTMAX || p->axis != p->type.rank - 1 || !inner(g, p, readers)) return 0;
    const ir_value *x = g->values[p->operands[0]];
    double factor;
    const ir_value *s = unscaled(g, x, &factor);
    if (s != x && !inner(g, x, readers)) return 0;
    if (!batched_product(s, 1) || !inner(g, s, readers)) return 0;
    const ir_type *q = &g->values[s->operands[0]]->type, *k = &g->values[s->operands[1]]->type;
    const ir_type *v = &g->values[o->operands[1]]->type;
    if (q->dtype != DT_F32 || !same_shape(q, k) || !same_shape(q, v)) return 0;
    *m = (attention_match){.scores = s, .scaling = s != x ? x : NULL, .softmax = p, .scale = p->scalar * factor};
    return 1;
}

/* The product's name, or for one lowering named after its op ("h.0.attn.matmul") the
 * same path ending in "attention". */
static const char *attention_name(ir_graph *g, const ir_value *o) {
    if (!o->name) return NULL;
    const char *last = strrchr(o->name, '.');
    last = last ? last + 1 : o->name;
    if (strcmp(last, ir_op_info_of(OP_MATMUL)->name) != 0) return o->name;
    return ir_internf(g, "%.*sattention", (int)(last - o->name), o->name);
}

int pass_fuse_attention(ir_graph *g) {
    if (!g->fuse_attention) return 0;
    int n = g->n_values;
    int *readers = calloc((size_t)n + 1, sizeof(int)), *map = malloc(((size_t)n + 1) * sizeof(int));
    attention_match *match = calloc((size_t)n + 1, sizeof *match);
    char *dropped = calloc((size_t)n + 1, 1);
    if (!readers || !map || !match || !dropped) abort();
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->values[i]->n_operands; k++) readers[g->values[i]->operands[k]]++;
    int any = 0;
    for (int i = 0; i < n; i++) {
        attention_match *m = &match[i];
        if (!match_attention(g, g->values[i], readers, m)) continue;
        dropped[m->scores->id] = dropped[m->softmax->id] = 1;
        if (m->scaling) dropped[m->scaling->id] = 1;
        any = 1;
    }
    if (any) {
        ir_value **old = g->values;
        g->values = NULL;
        g->n_values = g->cap_values = 0;
        for (int i = 0; i < n; i++) {
            ir_value *v = old[i];
            map[i] = -1;
            if (dropped[i]) continue;
            for (int k = 0; k < v->n_operands; k++) v->operands[k] = map[v->operands[k]];
            if (!match[i].softmax) {
                ir_append_value(g, v);
                map[i] = v->id;
                continue;
            }
            const attention_match *m = &match[i];
            int qkv[3] = {map[m->scores->operands[0]], map[m->scores->operands[1]], v->operands[1]};
            ir_value *a = ir_add(g, OP_ATTENTION, qkv, 3, m->softmax->loc);
            a->name = attention_name(g, v);
            a->phase = v->phase;
            a->segment = v->segment;
            a->marked = v->marked;
            a->annotated = v->annotated;
            a->scalar = m->scale;
            a->causal = m->softmax->causal;
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
    free(match);
    free(dropped);
    return 0;
}
