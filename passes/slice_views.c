/* slice_views.c: a parameter's window read where it lies, not copied.
 *
 * gpt.dm reads its fused c_attn weight [C, 3, C] and bias [3, C] as three windows each:
 * reshape(slice(weight, 1, P, P + 1), [C, C]) and reshape(slice(bias, 0, P, P + 1), [C]).
 * Made as values, each is a copy of its window every step (a kernel launch on the GPU), kept
 * alive to the backward's product. The window is already in the parameter's buffer:
 *   - a window that is contiguous there (the bias's: its dims before axis are 1) is read as
 *     it lies, whoever reads it (the memory plan gives it the parameter's buffer at
 *     ir_view_offset);
 *   - a window of rows apart (the weight's: C rows of C, 3 C apart) is read as it lies when
 *     only products read it, directly or through reshapes that keep its rows: a product
 *     takes an operand's rows any distance apart (lda, ldb: ir_rows_apart).
 * Only windows of a parameter itself: it lives through the step and nothing writes it
 * before the update, so a view of it reads the same numbers the copy held; a window of an
 * activation would keep the whole activation alive for the window's readers instead.
 * Under --quantize, a window that only quantized products read is no copy either: they
 * read its columns of the narrow weight (dm_quantized_window_view), and there may be no
 * f32 weight to copy from; other windows are copies there. Strided windows only where
 * products are f32 (a 16-bit product reads a cast of the window).
 *
 * requires: the final graph (after pass_precision); sets slice_view and slice_rows_apart;
 * changes nothing else. */
#include "passes.h"

/* Whether every reader of value id (after it) is a product that takes its rows `apart`
 * elements apart, directly or through temporary reshapes keeping its `rows` runs of
 * `cols`; and it is no output or loss. */
static int only_products_read(const ir_graph *g, int id, int64_t rows, int64_t cols) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == id) return 0;
    if (g->loss == id) return 0;
    const ir_value *v = g->values[id];
    for (int i = id + 1; i < g->n_values; i++) {
        const ir_value *r = g->values[i];
        for (int k = 0; k < r->n_operands; k++) {
            if (r->operands[k] != id) continue;
            if (r->op == OP_MATMUL && r->batch_dims == 0 && k < 2 && r->stage == v->stage) continue;
            if (r->op != OP_RESHAPE || !ir_in_operand_buffer(r) || r->type.rank == 0) return 0;
            ir_type t = ir_local_type(g, &r->type);
            if (t.shape[t.rank - 1] != cols || ir_numel(&t) != rows * cols || !only_products_read(g, i, rows, cols))
                return 0;
        }
    }
    return 1;
}

/* Whether slice v is read in place, and its rows' distance (0: contiguous). */
static int reads_in_place(const ir_graph *g, const ir_value *v, int64_t *rows_apart) {
    if (v->op != OP_SLICE || v->role != ROLE_TEMP) return 0;
    const ir_value *p = g->values[v->operands[0]];
    if (dm_quantized_window_view(g, v->id)) { /* --quantize: its products read the narrow weight's columns */
        int64_t first, rows, cols;
        ir_type whole = ir_local_type(g, &p->type), piece = ir_local_type(g, &v->type);
        return dm_window_layout(&whole, &piece, v->axis, v->offset, &first, &rows, &cols, rows_apart);
    }
    if (p->op != OP_PARAM || p->role != ROLE_PARAM || p->type.dtype != v->type.dtype || v->type.rank == 0 ||
        p->type.split[v->axis] != IR_REPLICATED)
        return 0;
    ir_type whole = ir_local_type(g, &p->type), piece = ir_local_type(g, &v->type);
    int64_t first, rows, cols;
    if (!dm_window_layout(&whole, &piece, v->axis, v->offset, &first, &rows, &cols, rows_apart)) return 0;
    if (rows == 1) {
        *rows_apart = 0;
        return 1;
    }
    /* the products read its rows as they lie: rows of its last dim, f32 products (16-bit
     * ones read a cast of it, which passes/precision.c adds later), no quantized weight */
    return !g->quantize_bits && g->product_dtype == DT_F32 && cols == piece.shape[piece.rank - 1] &&
           only_products_read(g, v->id, rows, cols);
}

int dm_slice_reads_in_place(const ir_graph *g, const ir_value *v) {
    int64_t rows_apart;
    return v->slice_view || reads_in_place(g, v, &rows_apart);
}

int pass_slice_views(ir_graph *g) {
    int views = 0;
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        int64_t rows_apart;
        if (v->slice_view || !reads_in_place(g, v, &rows_apart)) continue;
        v->slice_view = 1;
        v->slice_rows_apart = rows_apart;
        views++;
    }
    return views;
}
