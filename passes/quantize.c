/* quantize.c: which weights --quantize stores narrow (docs/compression.md): the code
 * generator's (codegen/emit_quant.c) and --explain's (explain_quant.c) one rule. */
#include "passes.h"

/* Whether forward op v reads its operand k as an embedding's table (rows gathered). */
static int gathers_table(const ir_value *v, int k) { return v->op == OP_EMBED && k == 0; }

/* Whether every forward op reading parameter w is a product reading it x @ transpose(w),
 * or with --quantize-embeddings an embedding gathering its rows: the one layout its
 * narrow copy then has, a scale per row of w (without the option, a weight an embedding
 * also gathers, gpt.dm's tied head, stays f32). */
static int read_transposed_only(const ir_graph *g, int w) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (v->operands[k] == w && !(v->op == OP_MATMUL && k == 1 && v->trans_b && !v->trans_a && !v->batch_dims) &&
                !(g->quantize_embeddings && gathers_table(v, k)))
                return 0;
    }
    return 1;
}

int dm_quantized_table(const ir_graph *g, const ir_value *v) {
    if (!g->quantize_bits || !g->quantize_embeddings || v->phase != PHASE_FORWARD || v->op != OP_EMBED) return -1;
    const ir_value *t = g->values[v->operands[0]];
    if (t->role != ROLE_PARAM || t->type.rank != 2 || t->type.dtype != DT_F32) return -1;
    return read_transposed_only(g, t->id) ? t->id : -1;
}

/* Whether every reader of value id, directly or through reshapes to 2 dims, is a forward
 * product reading it as x @ it (f32 x): the window's readers then all read the narrow
 * weight, and the slice is no copy (dm_quantized_window_view), which they depend on. */
static int read_as_windows_only(const ir_graph *g, int id) {
    int readers = 0;
    for (int i = id + 1; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++) {
            if (v->operands[k] != id) continue;
            int product = v->op == OP_MATMUL && k == 1 && v->phase == PHASE_FORWARD && !v->trans_a && !v->trans_b &&
                          !v->batch_dims && g->values[v->operands[0]]->type.dtype == DT_F32;
            int reshape = v->op == OP_RESHAPE && v->type.rank == 2 && read_as_windows_only(g, i);
            if (!product && !reshape) return 0;
            readers++;
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == id) return 0;
    return readers > 0 && g->loss != id;
}

/* Whether v is the reshape (or none) of a slice of an f32 parameter that is a range of the
 * parameter's columns seen as [k, n] (k its first dim), which only products read (x @ it):
 * gpt.dm's reshape(slice(c_attn, 1, P, P + 1), [C, C]) of its [C, 3, C] weight, columns P C
 * to (P + 1) C of [C, 3 C]. The parameter's id, and the range in *col0, *cols; -1 for any
 * other v. */
static int column_window_of(const ir_graph *g, const ir_value *v, int64_t *col0, int64_t *cols) {
    if (v->op == OP_RESHAPE && v->type.rank == 2) v = g->values[v->operands[0]];
    if (v->op != OP_SLICE || v->role != ROLE_TEMP || v->phase != PHASE_FORWARD || !read_as_windows_only(g, v->id))
        return -1;
    const ir_value *p = g->values[v->operands[0]];
    if (p->role != ROLE_PARAM || p->type.dtype != DT_F32 || v->type.dtype != DT_F32 || p->type.rank < 2) return -1;
    int64_t first, rows, run, apart;
    if (!dm_window_layout(&p->type, &v->type, v->axis, v->offset, &first, &rows, &run, &apart)) return -1;
    int64_t k = p->type.shape[0], n = ir_numel(&p->type) / k;
    if (rows != k || (rows > 1 && apart != n) || first + run > n) return -1;
    *col0 = first;
    *cols = run;
    return p->id;
}

/* The weight product v reads, and its column window (the whole: *col0 0, *cols its n). */
static int product_weight(const ir_graph *g, const ir_value *v, int64_t *col0, int64_t *cols) {
    if (v->op != OP_MATMUL || v->phase != PHASE_FORWARD || v->trans_a || v->batch_dims) return -1;
    const ir_value *b = g->values[v->operands[1]];
    if (g->values[v->operands[0]]->type.dtype != DT_F32) return -1;
    if (!v->trans_b && b->role != ROLE_PARAM) {
        int w = column_window_of(g, b, col0, cols);
        /* the window as the product reads it: [k, cols] */
        return w >= 0 && b->type.rank == 2 && b->type.shape[1] == *cols ? w : -1;
    }
    int reads = b->role == ROLE_PARAM && b->type.rank == 2 && b->type.dtype == DT_F32;
    if (!reads || (v->trans_b && !read_transposed_only(g, b->id))) return -1;
    *col0 = 0;
    *cols = b->type.shape[v->trans_b ? 0 : 1];
    return b->id;
}

int dm_quantized_window(const ir_graph *g, const ir_value *v, int64_t *col0, int64_t *cols) {
    int w = product_weight(g, v, col0, cols);
    if (w < 0) return -1;
    int64_t n = ir_numel(&g->values[w]->type) / g->values[w]->type.shape[v->trans_b ? 1 : 0];
    return *col0 == 0 && *cols == n ? 0 : 1;
}

int dm_quantized_weight_of(const ir_graph *g, const ir_value *v) {
    int64_t col0, cols;
    return product_weight(g, v, &col0, &cols);
}

/* Whether every reader of value id is a quantized product of parameter w, directly or
 * through the slice and reshape of its column window. */
static int read_by_quantized_products(const ir_graph *g, int id, int w) {
    int readers = 0;
    for (int i = id + 1; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++) {
            if (v->operands[k] != id) continue;
            if ((k == 1 && dm_quantized_weight_of(g, v) == w) || (gathers_table(v, k) && dm_quantized_table(g, v) == w))
                readers++;
            else if ((v->op == OP_SLICE || v->op == OP_RESHAPE) && k == 0 && read_by_quantized_products(g, i, w)) readers++;
            else return 0;
        }
    }
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == id) return 0;
    return readers > 0 && g->loss != id;
}

int dm_weight_held_narrow(const ir_graph *g, int w) {
    if (!g->quantize_narrow_only || g->values[w]->role != ROLE_PARAM) return 0;
    return read_by_quantized_products(g, w, w);
}

int dm_quantized_window_view(const ir_graph *g, int id) {
    if (!g->quantize_bits) return 0;
    const ir_value *v = g->values[id];
    int64_t col0, cols;
    if (v->op != OP_SLICE || column_window_of(g, v, &col0, &cols) < 0) return 0;
    return read_by_quantized_products(g, id, v->operands[0]);
}
