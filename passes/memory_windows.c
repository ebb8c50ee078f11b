/* memory_windows.c: gradients assembled in place (part of pass_memory).
 *
 * The gradient of a tensor read in slices is a sum of pads: each slice's gradient placed
 * in its window of zeros, the pads added up (gpt.dm's fused q | k | v weight and bias:
 * three pads of [C, 3, C] and two adds, for three [C, C] products). When the windows do
 * not overlap and together cover the tensor, the sum is the pieces side by side: the pads
 * and adds share the sum's buffer, each pad writes only its window (no zeros, no adds),
 * and a piece made by a product or a reduction is written straight into its window (the
 * product with its rows that far apart, ldc), so the pad has nothing left to copy. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* A value of the tree under root: alike in type, stage and phase, a temporary read once. */
static int joins_tree(const ir_graph *g, const int *readers, const ir_value *root, int id) {
    const ir_value *v = g->values[id];
    return v->role == ROLE_TEMP && readers[id] == 1 && v->stage == root->stage && v->phase == root->phase &&
           ir_same_type(&v->type, &root->type);
}

/* a sum of more pieces than this is left as pads and adds */
#define MAX_PIECES 64

typedef struct tree {
    int pads[MAX_PIECES], n_pads;
    int adds[MAX_PIECES], n_adds;
} tree;

/* Collects the pads under add `id`, the adds between; 0 when a leaf is anything else. */
static int collect(const ir_graph *g, const int *readers, const ir_value *root, int id, tree *t) {
    const ir_value *v = g->values[id];
    if (v->op != OP_ADD || v->operands[0] == v->operands[1]) return 0;
    if (t->n_adds >= MAX_PIECES) return 0;
    t->adds[t->n_adds++] = id;
    for (int k = 0; k < 2; k++) {
        int o = v->operands[k];
        if (!joins_tree(g, readers, root, o)) return 0;
        if (g->values[o]->op == OP_PAD) {
            if (t->n_pads >= MAX_PIECES) return 0;
            t->pads[t->n_pads++] = o;
        } else if (!collect(g, readers, root, o, t)) {
            return 0;
        }
    }
    return 1;
}

/* Whether the pads' windows, along one unsplit dim, tile it: disjoint, nothing left out. */
static int windows_tile(const ir_graph *g, const tree *t, const ir_type *whole) {
    int axis = g->values[t->pads[0]]->axis;
    if (axis < 0 || axis >= whole->rank || whole->split[axis] != IR_REPLICATED) return 0;
    int64_t covered = 0;
    for (int i = 0; i < t->n_pads; i++) {
        const ir_value *p = g->values[t->pads[i]];
        if (p->axis != axis) return 0;
        covered += g->values[p->operands[0]]->type.shape[axis];
    }
    if (covered != whole->shape[axis]) return 0;
    for (int i = 0; i < t->n_pads; i++)
        for (int j = 0; j < i; j++) {
            const ir_value *a = g->values[t->pads[i]], *b = g->values[t->pads[j]];
            int64_t a_end = a->offset + g->values[a->operands[0]]->type.shape[axis];
            int64_t b_end = b->offset + g->values[b->operands[0]]->type.shape[axis];
            if (a->offset < b_end && b->offset < a_end) return 0;
        }
    return 1;
}

/* Where a window `piece` of `whole`, starting at `offset` along `axis` (local types), lies
 * in whole's buffer: its first element, and, when its elements are `rows` runs of `cols`
 * apart by row_stride, those (a contiguous window: rows 1). 0 when it is laid out
 * otherwise. Shared with passes/slice_views.c. */
int dm_window_layout(const ir_type *whole, const ir_type *piece, int axis, int64_t offset, int64_t *first, int64_t *rows,
                     int64_t *cols, int64_t *row_stride) {
    int64_t stride[IR_MAX_RANK], s = 1;
    for (int d = whole->rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= whole->shape[d];
    }
    *first = offset * stride[axis];
    /* merge dims from the last: a dim joins the run inside it when it steps by its size */
    int64_t run = 1, outer = 1, outer_stride = 0;
    int d = piece->rank - 1;
    for (; d >= 0 && (piece->shape[d] == 1 || stride[d] == run); d--) run *= piece->shape[d];
    if (d >= 0) { /* the rows: the dims outside the run, stepping as one */
        outer_stride = stride[d];
        outer = piece->shape[d];
        for (d--; d >= 0; d--) {
            if (piece->shape[d] == 1) continue;
            if (stride[d] != outer * outer_stride) return 0;
            outer *= piece->shape[d];
        }
    }
    *rows = outer, *cols = run, *row_stride = outer > 1 ? outer_stride : run;
    return 1;
}

/* Where a piece (the operand of pad p) lies in its sum's local buffer (dm_window_layout). */
static int piece_layout(const ir_graph *g, const ir_value *p, int64_t *first, int64_t *rows, int64_t *cols,
                        int64_t *row_stride) {
    ir_type whole = ir_local_type(g, &p->type), piece = ir_local_type(g, &g->values[p->operands[0]]->type);
    return dm_window_layout(&whole, &piece, p->axis, p->offset, first, rows, cols, row_stride);
}

/* The value that makes pad p's piece, through reshapes read once, when it can write the
 * piece where the sum holds it: a product (not batched, no bias of its own) whose rows
 * are the runs, or a reduction into a contiguous window; -1 otherwise. */
static int piece_maker(const ir_graph *g, const int *readers, const dm_memory_plan *plan, const ir_value *p,
                       int64_t rows, int64_t cols) {
    int id = p->operands[0];
    for (;;) {
        const ir_value *v = g->values[id];
        if (v->role != ROLE_TEMP || readers[id] != 1 || v->stage != p->stage || v->phase != p->phase ||
            v->type.dtype != DT_F32)
            return -1;
        if (v->op != OP_RESHAPE) break;
        id = v->operands[0];
    }
    const ir_value *v = g->values[id];
    if (ir_storage_elems(g, v) != ir_local_numel(g, &v->type)) return -1;
    if (v->op == OP_SUM || v->op == OP_SUM_TO) return rows == 1 ? id : -1;
    if (v->op != OP_MATMUL || v->batch_dims || plan->bias_add_of[id] >= 0 || plan->sum_add_of[id] >= 0) return -1;
    ir_type out = ir_local_type(g, &v->type);
    int64_t n = out.shape[out.rank - 1];
    return rows == 1 || (n == cols && ir_numel(&out) == rows * cols) ? id : -1;
}

void dm_plan_window_assemblies(const ir_graph *g, const int *readers, dm_memory_plan *plan) {
    int n = g->n_values;
    plan->assembled_in = malloc(((size_t)n + 1) * sizeof(int));
    plan->row_stride = calloc((size_t)n + 1, sizeof(int64_t));
    if (!plan->assembled_in || !plan->row_stride) abort();
    for (int i = 0; i < n; i++) plan->assembled_in[i] = -1;
    tree t;
    for (int r = n - 1; r >= 0; r--) {
        const ir_value *root = g->values[r];
        /* a gradient whose buffer ZeRO 2 gives up holds no whole tensor to assemble in */
        int holds_whole = root->role == ROLE_TEMP || (root->role == ROLE_GRAD && g->zero < 2);
        if (plan->assembled_in[r] >= 0 || root->op != OP_ADD || !holds_whole || root->type.dtype != DT_F32) continue;
        t.n_pads = t.n_adds = 0;
        if (!collect(g, readers, root, r, &t) || t.n_pads < 2 || !windows_tile(g, &t, &root->type)) continue;
        for (int i = 0; i < t.n_adds; i++) plan->assembled_in[t.adds[i]] = r;
        for (int i = 0; i < t.n_pads; i++) {
            const ir_value *p = g->values[t.pads[i]];
            plan->assembled_in[p->id] = r;
            int64_t first, rows, cols, row_stride;
            if (!piece_layout(g, p, &first, &rows, &cols, &row_stride)) continue;
            int maker = piece_maker(g, readers, plan, p, rows, cols);
            if (maker < 0) continue;
            plan->assembled_in[maker] = r;
            plan->within[maker] = first;
            if (rows > 1) plan->row_stride[maker] = row_stride;
        }
    }
}

int dm_piece_in_place(const dm_memory_plan *plan, const ir_value *pad) {
    int root = plan->assembled_in[pad->id];
    return root >= 0 && plan->storage_of[pad->operands[0]] == root;
}
