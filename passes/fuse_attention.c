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
 * Where the target's kernels take the heads side by side in a row (g->attention_heads_inner:
 * both targets'), the heads' transposes around it go too: when q, k and v are each
 * transpose(x, T, H) of an x of shape (.., T, H, D) read by nothing else, and the result's
 * only reader is the transpose back, the attention reads the three x and writes (.., T, H,
 * D) itself (heads_inner), in place of that transpose. gpt.dm's heads are split and
 * merged so: 4 copies of the activations a layer forward and 4 backward are not made.
 *
 * Where they take k and v with fewer heads than q (g->attention_kv_groups: both targets'),
 * grouped-query attention's repeats go too: when k and v are each repeat_kv's reshape of a
 * broadcast of x (.., H, T, D) to (.., H, R, T, D), read by nothing else, the attention reads
 * the two x (kv_group R: query head h reads their head h / R) and its backward sums the R
 * query heads' gradients of a kv head itself. llama.dm's keys and values are not copied R
 * times (nor kept so for the backward), and the gradients' sum over R is no loop of its own.
 *
 * Where the target has attention kernels (the driver sets g->fuse_attention;
 * --no-fuse-attention clears it): the C target's blocked kernels (runtime/dmrt_attention.h),
 * the CUDA target's a thread a row in f32 (runtime/cuda/attention.cu) and, under
 * --precision bf16 or fp16, cuDNN's in that type (runtime/cuda/attention16.cu). Both
 * targets' kernels round the f32 operands themselves where they multiply in 16 bits
 * (g->attention_16bit: CUDA's bf16 and fp16, the C target's bf16).
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
 * softmax, and the scale in all; with the heads side by side, the transposes of q, k and
 * v and the one of the result (else NULL). */
typedef struct attention_match {
    const ir_value *scores, *scaling, *softmax;
    double scale;
    const ir_value *split[3], *merge;
    int group;                          /* grouped-query attention's R, else 0 */
    const ir_value *repeat[2][2];       /* then k's and v's reshape and broadcast (the
                                         * broadcast's operand: the value it repeats) */
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

/* Whether v swaps the positions' and the heads' dims of a (.., T, H, D) (or back). */
static int swaps_heads(const ir_value *v) {
    int r = v->type.rank;
    if (v->op != OP_TRANSPOSE || r < 3) return 0;
    for (int i = 0; i < r; i++)
        if (v->perm[i] != (i == r - 3 ? r - 2 : i == r - 2 ? r - 3 : i)) return 0;
    return 1;
}

/* With the heads side by side: q, k and v each a transpose of (.., T, H, D) read only by
 * the pattern, and the result o read only by the transpose back; fills m's split and
 * merge, or leaves them NULL. */
static void match_heads_inner(const ir_graph *g, const ir_value *o, const int *readers, attention_match *m) {
    if (!g->attention_heads_inner || named_by_program(g, o)) return;
    const int qkv[3] = {m->scores->operands[0], m->scores->operands[1], o->operands[1]};
    const ir_value *split[3], *merge = prune_heads_only_reader(g, o); /* (the graph is all forward here) */
    for (int i = 0; i < 3; i++) {
        split[i] = g->values[qkv[i]];
        if (!swaps_heads(split[i]) || !inner(g, split[i], readers)) return;
    }
    if (!merge || !swaps_heads(merge) || named_by_program(g, merge)) return;
    memcpy(m->split, split, sizeof split);
    m->merge = merge;
}

/* kv (k or v) as Hugging Face's repeat_kv makes it: reshape(broadcast(x)), x of shape (..,
 * H, T, D) given a dim of R after its heads, (.., H, R, T, D), then merged (.., H * R, T,
 * D), each read once; R (> 1) and sets repeat; else 0. */
static int64_t repeated_heads(const ir_graph *g, const ir_value *kv, const int *readers, const ir_value *repeat[2]) {
    int r = kv->type.rank;
    if (kv->op != OP_RESHAPE || r < 3 || !inner(g, kv, readers)) return 0;
    const ir_value *b = g->values[kv->operands[0]];
    if (b->op != OP_BROADCAST || b->type.rank != r + 1 || b->axes != 1u << (r - 2) || !inner(g, b, readers)) return 0;
    const ir_type *big = &b->type, *small = &g->values[b->operands[0]]->type;
    int64_t group = big->shape[r - 2];
    if (group < 2 || small->rank != r || kv->type.shape[r - 3] != big->shape[r - 3] * group) return 0;
    for (int i = 0; i < r; i++) /* x is big without its R dim; kv is big with H and R merged */
        if (small->shape[i] != big->shape[i < r - 2 ? i : i + 1] ||
            (i != r - 3 && kv->type.shape[i] != big->shape[i < r - 3 ? i : i + 1]))
            return 0;
    repeat[0] = kv, repeat[1] = b;
    return group;
}

/* With grouped-query attention (the target's kernels take k and v's fewer heads:
 * g->attention_kv_groups) and k and v each repeated by one R: fills m's group, repeat and
 * kv. Not where an axis of the mesh that may split heads (any but data and pipeline: the
 * tensor axis) would split the kv heads unevenly: the kernels could not then find a query
 * head's kv head on its rank (ir_verify checks that q, k and v's heads split alike). */
static void match_kv_group(const ir_graph *g, const ir_value *o, const int *readers, attention_match *m) {
    if (!g->attention_kv_groups || m->merge) return;
    const ir_value *repeat[2][2];
    int64_t group[2];
    for (int i = 0; i < 2; i++) {
        const ir_value *operand = g->values[i == 0 ? m->scores->operands[1] : o->operands[1]];
        group[i] = repeated_heads(g, operand, readers, repeat[i]);
        if (!group[i]) return;
    }
    if (group[0] != group[1]) return;
    const ir_type *kv = &g->values[repeat[0][1]->operands[0]]->type;
    int64_t kv_heads = kv->shape[kv->rank - 3];
    for (int a = 0; a < g->n_axes; a++)
        if (a != g->data_axis && a != g->pipe_axis && kv_heads % g->axes[a].size != 0) return;
    m->group = (int)group[0];
    memcpy(m->repeat, repeat, sizeof repeat);
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
    match_heads_inner(g, o, readers, m);
    match_kv_group(g, o, readers, m);
    return 1;
}

/* Where v's name ends in its op's ("h.0.attn.matmul", as lowering names a value the
 * program does not): the start of that last part; else NULL. */
static const char *named_after_op(const ir_value *v) {
    if (!v->name) return NULL;
    const char *last = strrchr(v->name, '.');
    last = last ? last + 1 : v->name;
    return strcmp(last, ir_op_info_of(v->op)->name) == 0 ? last : NULL;
}

/* The product's name, or for one lowering named after its op ("h.0.attn.matmul") the
 * same path ending in "attention". */
static const char *attention_name(ir_graph *g, const ir_value *o) {
    const char *last = named_after_op(o);
    if (!last) return o->name;
    return ir_internf(g, "%.*sattention", (int)(last - o->name), o->name);
}

/* q, k and v's transposes (or k and v's repeats) go: the values they transposed (or
 * repeated), named after their op, take their names (gpt.dm's q, k and v, which the
 * generated code and gradients then show). */
static void name_after(const ir_value *gone, ir_value *x) {
    if (gone->name && named_after_op(x)) x->name = gone->name;
}

static void name_after_dropped(ir_graph *g, const attention_match *m) {
    for (int k = 0; k < 3 && m->merge; k++) name_after(m->split[k], g->values[m->split[k]->operands[0]]);
    for (int k = 0; k < 2 && m->group; k++) name_after(m->repeat[k][0], g->values[m->repeat[k][1]->operands[0]]);
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
        if (m->merge) {
            for (int k = 0; k < 3; k++) dropped[m->split[k]->id] = 1;
            dropped[m->merge->id] = 1;
        }
        for (int k = 0; k < 2 && m->group; k++) dropped[m->repeat[k][0]->id] = dropped[m->repeat[k][1]->id] = 1;
        name_after_dropped(g, m);
        any = 1;
    }
    if (any) {
        ir_value **old = g->values;
        g->values = NULL;
        g->n_values = g->cap_values = 0;
        /* a dropped op's id maps to none, but a merge's: its attention's (set at the
         * attention, which comes first) */
        for (int i = 0; i < n; i++) map[i] = -1;
        for (int i = 0; i < n; i++) {
            ir_value *v = old[i];
            if (dropped[i]) continue;
            for (int k = 0; k < v->n_operands; k++) v->operands[k] = map[v->operands[k]];
            if (!match[i].softmax) {
                ir_append_value(g, v);
                map[i] = v->id;
                continue;
            }
            const attention_match *m = &match[i];
            int qkv[3] = {map[m->scores->operands[0]], map[m->scores->operands[1]], v->operands[1]};
            if (m->merge)
                for (int k = 0; k < 3; k++) qkv[k] = map[m->split[k]->operands[0]];
            /* (the repeats are dropped, so their operands are still the old ids) */
            for (int k = 0; k < 2 && m->group; k++) qkv[1 + k] = map[m->repeat[k][1]->operands[0]];
            ir_value *a = ir_add(g, OP_ATTENTION, qkv, 3, m->softmax->loc);
            a->name = attention_name(g, v);
            a->phase = v->phase;
            a->segment = v->segment;
            a->marked = v->marked;
            a->annotated = v->annotated;
            a->scalar = m->scale;
            a->causal = m->softmax->causal;
            a->type = m->merge ? m->merge->type : v->type;
            a->heads_inner = m->merge != NULL;
            a->kv_group = m->group;
            for (int k = 0; k < g->n_cuts; k++)
                if (g->cut_after[k] == v) g->cut_after[k] = a;
            map[i] = a->id;
            if (m->merge) map[m->merge->id] = a->id;
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
