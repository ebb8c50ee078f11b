/* ir.c: graph construction, op lookup and interned strings. */
#include "ir.h"

#include <ctype.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const ir_op_info op_infos[OP_COUNT] = {
#define OP(id, nm, ar, cl, sh, fw, bw) [OP_##id] = {.name = nm, .arity = ar, .cls = OPC_##cl, .shard = sh, .forward = fw, .backward = bw},
#include "ops.def"
#undef OP
};

const ir_op_info *ir_op_info_of(ir_op op) { return &op_infos[op]; }

ir_op ir_op_by_name(const char *name) {
    /* the first letters compared first: lowering asks this of every call it lowers */
    for (int i = 0; i < OP_COUNT; i++)
        if (op_infos[i].name[0] == name[0] && strcmp(op_infos[i].name, name) == 0) return (ir_op)i;
    return OP_COUNT;
}

const char *ir_dtype_name(ir_dtype t) {
    switch (t) {
    case DT_F32: return "f32";
    case DT_I32: return "i32";
    case DT_VOID: return "void";
    case DT_BF16: return "bf16";
    case DT_F16: return "f16";
    }
    return "?";
}

int ir_dtype_is_half(ir_dtype t) { return t == DT_BF16 || t == DT_F16; }

int ir_dtype_bytes(ir_dtype t) {
    switch (t) {
    case DT_F32: case DT_I32: return 4;
    case DT_BF16: case DT_F16: return 2;
    case DT_VOID: return 0;
    }
    return 0;
}

int64_t ir_numel(const ir_type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        if (__builtin_mul_overflow(n, t->shape[i], &n)) return INT64_MAX;
    return n;
}

int ir_same_type(const ir_type *a, const ir_type *b) {
    if (a->rank != b->rank || a->dtype != b->dtype || a->partial != b->partial) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d] || a->split[d] != b->split[d]) return 0;
    return 1;
}

int64_t ir_local_numel(const ir_graph *g, const ir_type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->split[i] == IR_REPLICATED ? t->shape[i] : t->shape[i] / g->axes[t->split[i]].size;
    return n;
}

ir_type ir_local_type(const ir_graph *g, const ir_type *t) {
    ir_type local = *t;
    for (int d = 0; d < local.rank; d++)
        if (local.split[d] != IR_REPLICATED) local.shape[d] /= g->axes[local.split[d]].size;
    return local;
}

int ir_role_axis(const ir_graph *g, int axis) { return axis >= 0 && g->axes[axis].size > 1 ? axis : -1; }

int ir_pipeline_axis(const ir_graph *g) { return ir_role_axis(g, g->pipe_axis); }

int ir_is_scheduled(const ir_graph *g) { return g->microbatches > 1 || ir_pipeline_axis(g) >= 0; }

int64_t ir_mesh_ranks(const ir_graph *g) {
    int64_t n = 1;
    for (int a = 0; a < g->n_axes; a++) n *= g->axes[a].size;
    return n;
}

int ir_class_split_axis(const ir_graph *g, const ir_value *v) {
    if (v->op != OP_XENT_STATS && v->op != OP_CROSS_ENTROPY_GRAD) return IR_REPLICATED;
    const ir_type *logits = &g->values[v->operands[0]]->type;
    return logits->split[logits->rank - 1];
}

int64_t ir_storage_elems(const ir_graph *g, const ir_value *v) {
    int64_t n = ir_local_numel(g, &v->type);
    if (v->op == OP_ATTENTION) n += n / v->type.shape[v->type.rank - 1];
    if (ir_dtype_bytes(v->type.dtype) == 2) n = (n + 1) / 2;
    return n;
}

ir_attention_layout ir_attention_layout_of(const ir_value *v, const ir_type *q) {
    ir_attention_layout a = {.positions_dim = q->rank - (v->heads_inner ? 3 : 2), .inner = 1,
                             .group = v->kv_group > 1 ? v->kv_group : 1};
    a.positions = q->shape[a.positions_dim];
    a.width = q->shape[q->rank - 1];
    if (v->heads_inner) a.inner = q->shape[q->rank - 2];
    a.heads = ir_numel(q) / (a.positions * a.width);
    return a;
}

int64_t ir_view_offset(const ir_graph *g, const ir_value *v) {
    if (v->op == OP_ATTENTION_LSE) return ir_local_numel(g, &g->values[v->operands[0]]->type);
    if (v->op == OP_STACKED_PART) {
        /* part `offset` of (parts, ...): k and v's gradients of a grouped-query attention
         * are smaller than their slot, which is q's */
        const ir_type *stacked = &g->values[v->operands[0]]->type;
        return v->offset * (ir_local_numel(g, stacked) / stacked->shape[0]);
    }
    if (v->op == OP_SLICE && v->slice_view) {
        /* the window's first element: offset steps of the dims inside axis */
        ir_type whole = ir_local_type(g, &g->values[v->operands[0]]->type);
        int64_t inside = 1;
        for (int d = v->axis + 1; d < whole.rank; d++) inside *= whole.shape[d];
        return v->offset * inside;
    }
    return 0;
}

int ir_in_operand_buffer(const ir_value *v) {
    return (v->op == OP_RESHAPE || v->op == OP_PARAM_VIEW || ir_op_info_of(v->op)->cls == OPC_VIEW ||
            (v->op == OP_SLICE && v->slice_view)) &&
           v->role == ROLE_TEMP;
}

int64_t ir_rows_apart(const ir_graph *g, int id) {
    const ir_value *v = g->values[id];
    int64_t cols = v->type.rank ? ir_local_type(g, &v->type).shape[v->type.rank - 1] : 1;
    const ir_value *x = v;
    while (x->op == OP_RESHAPE && ir_in_operand_buffer(x)) x = g->values[x->operands[0]];
    if (x->op == OP_SLICE && x->slice_view && x->slice_rows_apart) return x->slice_rows_apart;
    return cols;
}

int ir_reads_operand(const ir_value *v, int k) {
    if (v->op != OP_UNARY_GRAD) return 1;
    static const char *const vars[] = {"x", "y", "dy"};
    const char *expr = ir_op_info_of(v->unary)->backward;
    size_t n = strlen(vars[k]);
    for (const char *p = expr; (p = strstr(p, vars[k])); p += n) {
        int starts = p == expr || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
        int ends = !(isalnum((unsigned char)p[n]) || p[n] == '_');
        if (starts && ends) return 1;
    }
    return 0;
}

int ir_is_partitioned(const ir_graph *g) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_type *t = &g->values[i]->type;
        if (t->partial) return 1;
        for (int d = 0; d < t->rank; d++)
            if (t->split[d] != IR_REPLICATED) return 1;
    }
    return 0;
}

/* The graph's values, their operand lists and its strings live in chunks freed with the
 * graph: a compile makes thousands of each, and the planner compiles thousands of
 * candidates, where allocating and freeing them one by one took about 6% of its time. */
typedef struct ir_chunk {
    struct ir_chunk *next;
    size_t used, size;
    max_align_t room[];
} ir_chunk;

enum { IR_CHUNK_BYTES = 64 * 1024 };

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "dmc: error: out of memory\n");
        abort();
    }
    return p;
}

ir_graph *ir_graph_new(const char *model) {
    ir_graph *g = xcalloc(1, sizeof *g);
    g->model = ir_intern(g, model);
    g->loss = -1;
    g->pipe_axis = g->data_axis = g->tensor_axis = -1;
    g->microbatches = 1;
    return g;
}

void ir_graph_free(ir_graph *g) {
    if (!g) return;
    free(g->values);
    free(g->params);
    free(g->inputs);
    free(g->cut_after);
    free(g->outputs);
    free(g->output_locs);
    free(g->grads);
    free(g->dim_names);
    free(g->dim_values);
    for (ir_chunk *c = g->arena, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(g);
}

/* Room for `bytes`, owned by the graph, not zeroed. A chunk is only ever filled, never
 * reused: what a pass drops stays until the graph is freed. */
static void *graph_alloc(ir_graph *g, size_t bytes) {
    size_t align = alignof(max_align_t);
    bytes = (bytes + align - 1) / align * align;
    ir_chunk *c = g->arena;
    if (!c || c->size - c->used < bytes) {
        /* a large request gets a chunk of its own, behind the current one, whose room
         * stays in use */
        size_t size = bytes > IR_CHUNK_BYTES / 4 ? bytes : IR_CHUNK_BYTES;
        ir_chunk *fresh = malloc(sizeof *fresh + size);
        if (!fresh) {
            fprintf(stderr, "dmc: error: out of memory\n");
            abort();
        }
        *fresh = (ir_chunk){.size = size};
        if (c && bytes > IR_CHUNK_BYTES / 4) {
            fresh->next = c->next;
            c->next = fresh;
        } else {
            fresh->next = c;
            g->arena = fresh;
        }
        c = fresh;
    }
    void *p = (char *)c->room + c->used;
    c->used += bytes;
    return p;
}

/* A copy of count items of `size` in an array ir_grow can grow (room for the next power
 * of two of them). */
static void *copy_growable(const void *items, int count, size_t size) {
    size_t room = 4;
    while (room < (size_t)count) room *= 2;
    void *copy = xcalloc(room, size);
    if (count) memcpy(copy, items, (size_t)count * size);
    return copy;
}

ir_graph *ir_graph_copy(const ir_graph *g) {
    ir_graph *c = xcalloc(1, sizeof *c);
    *c = *g;
    c->arena = NULL;
    c->cap_values = g->n_values ? g->n_values : 1;
    c->values = xcalloc((size_t)c->cap_values, sizeof *c->values);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *from = g->values[i];
        ir_value *v = graph_alloc(c, sizeof *v);
        *v = *from;
        v->operands = graph_alloc(c, (size_t)(from->n_operands ? from->n_operands : 1) * sizeof(int));
        if (from->n_operands) memcpy(v->operands, from->operands, (size_t)from->n_operands * sizeof(int));
        c->values[i] = v;
    }
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->origin) c->values[i]->origin = c->values[g->values[i]->origin->id];
    c->params = copy_growable(g->params, g->n_params, sizeof *g->params);
    c->inputs = copy_growable(g->inputs, g->n_inputs, sizeof *g->inputs);
    c->outputs = copy_growable(g->outputs, g->n_outputs, sizeof *g->outputs);
    c->output_locs = copy_growable(g->output_locs, g->n_outputs, sizeof *g->output_locs);
    c->grads = g->grads ? copy_growable(g->grads, g->n_params, sizeof *g->grads) : NULL;
    c->dim_names = g->dim_names ? copy_growable(g->dim_names, g->n_dims, sizeof *g->dim_names) : NULL;
    c->dim_values = g->dim_values ? copy_growable(g->dim_values, g->n_dims, sizeof *g->dim_values) : NULL;
    if (g->cut_after) {
        c->cut_after = xcalloc((size_t)g->n_cuts + 1, sizeof *c->cut_after);
        for (int k = 0; k < g->n_cuts; k++) c->cut_after[k] = c->values[g->cut_after[k]->id];
    }
    return c;
}

/* Room for a string of len characters, owned by the graph. */
static char *new_string(ir_graph *g, size_t len) { return graph_alloc(g, len + 1); }

const char *ir_intern(ir_graph *g, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    return memcpy(new_string(g, n), s, n + 1);
}

/* Whether fmt converts nothing but strings (%s), as every name the passes make does
 * ("%s.%s", "d_%s"): ir_internf then joins them without printf, which took a fifth of the
 * planner's compiles. */
static int strings_only(const char *fmt) {
    for (const char *p = strchr(fmt, '%'); p; p = strchr(p + 2, '%'))
        if (p[1] != 's') return 0;
    return 1;
}

/* fmt with each %s replaced by the next argument (NULL printed as printf prints it) into
 * out, when out is not NULL; returns the length. */
static size_t join_strings(char *out, const char *fmt, va_list ap) {
    size_t len = 0;
    for (const char *p = fmt; *p; p++) {
        const char *piece = p, *arg = NULL;
        size_t n = 1;
        if (*p == '%') {
            arg = va_arg(ap, const char *);
            piece = arg ? arg : "(null)";
            n = strlen(piece);
            p++;
        }
        if (out) memcpy(out + len, piece, n);
        len += n;
    }
    if (out) out[len] = 0;
    return len;
}

const char *ir_internf(ir_graph *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int fast = strings_only(fmt);
    int n = fast ? (int)join_strings(NULL, fmt, ap) : vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    size_t len = n > 0 ? (size_t)n : 0;
    char *text = new_string(g, len);
    va_start(ap, fmt);
    if (fast) join_strings(text, fmt, ap);
    else vsnprintf(text, len + 1, fmt, ap);
    va_end(ap);
    return text;
}

unsigned ir_hash_string(const char *s) {
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

void *ir_grow(void *array, int count, size_t item_size) {
    if (count != 0 && (count & (count - 1)) != 0) return array;
    void *grown = realloc(array, (size_t)(count ? count * 2 : 4) * item_size);
    if (!grown) {
        fprintf(stderr, "dmc: error: out of memory\n");
        abort();
    }
    return grown;
}

void ir_append_value(ir_graph *g, ir_value *v) {
    if (g->n_values == g->cap_values) {
        g->cap_values = g->cap_values ? g->cap_values * 2 : 64;
        ir_value **grown = realloc(g->values, (size_t)g->cap_values * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "dmc: error: out of memory\n");
            abort();
        }
        g->values = grown;
    }
    v->id = g->n_values;
    g->values[g->n_values++] = v;
}

ir_value *ir_add(ir_graph *g, ir_op op, const int *operands, int n_operands, dm_loc loc) {
    ir_value *v = graph_alloc(g, sizeof *v);
    memset(v, 0, sizeof *v);
    v->op = op;
    v->n_operands = n_operands;
    v->operands = graph_alloc(g, (size_t)(n_operands ? n_operands : 1) * sizeof(int));
    if (n_operands) memcpy(v->operands, operands, (size_t)n_operands * sizeof(int));
    v->loc = loc;
    v->param_index = -1;
    v->unary = OP_COUNT;
    for (int i = 0; i < IR_MAX_RANK; i++) v->type.split[i] = IR_REPLICATED;
    ir_append_value(g, v);
    return v;
}

void ir_renumber_lists(ir_graph *g, const int *map) {
    for (int p = 0; p < g->n_params; p++) g->params[p] = map[g->params[p]];
    for (int p = 0; g->grads && p < g->n_params; p++) g->grads[p] = g->grads[p] >= 0 ? map[g->grads[p]] : -1;
    for (int i = 0; i < g->n_inputs; i++) g->inputs[i] = map[g->inputs[i]];
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = map[g->outputs[i]];
    if (g->loss >= 0) g->loss = map[g->loss];
}

void ir_drop_last(ir_graph *g) { g->n_values--; }

void ir_append_id(ir_graph *g, int **list, int *n, int id) {
    (void)g;
    *list = ir_grow(*list, *n, sizeof **list);
    (*list)[(*n)++] = id;
}

int ir_param_is_1d(const ir_graph *g, int p) {
    const ir_value *v = g->values[g->params[p]];
    return (v->stored_rank ? v->stored_rank : v->type.rank) <= 1;
}
