/* ir.c: graph construction, op lookup and interned strings. */
#include "ir.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const ir_op_info op_infos[OP_COUNT] = {
#define OP(id, nm, ar, cl, sh, fw, bw) [OP_##id] = {.name = nm, .arity = ar, .cls = OPC_##cl, .shard = sh, .forward = fw, .backward = bw},
#include "ops.def"
#undef OP
};

const ir_op_info *ir_op_info_of(ir_op op) { return &op_infos[op]; }

ir_op ir_op_by_name(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(op_infos[i].name, name) == 0) return (ir_op)i;
    return OP_COUNT;
}

const char *ir_dtype_name(ir_dtype t) {
    switch (t) {
    case DT_F32: return "f32";
    case DT_I32: return "i32";
    case DT_VOID: return "void";
    }
    return "?";
}

int64_t ir_numel(const ir_type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
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

int ir_pipeline_axis(const ir_graph *g) {
    return g->pipe_axis >= 0 && g->axes[g->pipe_axis].size > 1 ? g->pipe_axis : -1;
}

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

typedef struct ir_strings {
    struct ir_strings *next;
    char text[];
} ir_strings;

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
    g->pipe_axis = -1;
    g->microbatches = 1;
    return g;
}

void ir_graph_free(ir_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_values; i++) {
        free(g->values[i]->operands);
        free(g->values[i]);
    }
    free(g->values);
    free(g->params);
    free(g->inputs);
    free(g->cut_after);
    free(g->outputs);
    free(g->grads);
    free(g->dim_names);
    free(g->dim_values);
    for (ir_strings *s = g->strings, *next; s; s = next) {
        next = s->next;
        free(s);
    }
    free(g);
}

/* Room for a string of len characters, owned by the graph. */
static char *new_string(ir_graph *g, size_t len) {
    ir_strings *node = xcalloc(1, sizeof *node + len + 1);
    node->next = g->strings;
    g->strings = node;
    return node->text;
}

const char *ir_intern(ir_graph *g, const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    return memcpy(new_string(g, n), s, n + 1);
}

const char *ir_internf(ir_graph *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    size_t len = n > 0 ? (size_t)n : 0;
    char *text = new_string(g, len);
    va_start(ap, fmt);
    vsnprintf(text, len + 1, fmt, ap);
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
    ir_value *v = xcalloc(1, sizeof *v);
    v->op = op;
    v->n_operands = n_operands;
    v->operands = xcalloc((size_t)n_operands, sizeof(int));
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

void ir_drop_last(ir_graph *g) {
    ir_value *v = g->values[--g->n_values];
    free(v->operands);
    free(v);
}

void ir_append_id(ir_graph *g, int **list, int *n, int id) {
    (void)g;
    *list = ir_grow(*list, *n, sizeof **list);
    (*list)[(*n)++] = id;
}
