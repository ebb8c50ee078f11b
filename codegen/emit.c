/* emit.c: what to emit for a planned graph: the public header, the context, one
 * function per phase (forward, backward, update) with every buffer named after its
 * source expression, and the model descriptor for generic tools. Kernels are spelled by
 * a dialect (dialect.h). requires: shapes, autodiff, optimizer, memory plan. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen.h"
#include "dialect.h"
#include "schedule.h"

typedef struct emitter {
    const ir_graph *g;
    const dm_memory_plan *plan;
    const cg_dialect *dialect;
    const char *source_path;   /* as quoted in comments: the file name */
    const char *source_text;
    size_t source_len;
    size_t *line_start;        /* (n_lines) offset of each line of the source */
    int n_lines;
    char **cname;              /* (n_values) C identifier of the value's buffer */
    ir_type *local;            /* (n_values) the value as one rank holds it: split dims divided */
    int partitioned;           /* the mesh splits something: SPMD code with communicators */
    int64_t scratch_elems;     /* floats of ctx->scratch, which collectives rearrange blocks in */
    int *bucket_lead;          /* (n_values) for a gradient allreduced in a bucket: the bucket's
                                * first allreduce (which reduces them all); else -1 */
    int *bucket_ready;         /* (n_values) for a bucket's lead: the value after which every
                                * member's partial gradient is complete */
    int64_t bucket_floats;     /* the largest bucket */
    /* micro-batches and pipeline stages (g->microbatches > 1 or a pipeline axis): each
     * stage's forward and backward of one micro-batch are functions, run in the order of
     * the schedule by a generated step function per stage */
    int scheduled;
    int stages;                /* P (1 without a pipeline axis) */
    int pipe_axis;             /* the pipeline's mesh axis, or -1 */
    pipe_schedule sched;       /* every stage's actions, as the generated step runs them */
    int *slots;                /* (stages) micro-batches whose temporaries a stage holds at once
                                * (pipe_in_flight of sched): each has its own copy of the arena */
    uint64_t *needed_on;       /* (n_values) for a buffer's owner: the stages reading it (bit per stage) */
    const char *arena_var;     /* how code reaches the arena: ctx->arena, or a micro-batch's copy */
    int in_micro;              /* the function being emitted has a micro-batch index `micro` */
    char prefix_upper[128];
    cg_writer w;
} emitter;

/* ---- names ----------------------------------------------------------------------------- */

static const char *const reserved[] = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
    "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
    "volatile", "while", "ctx", "batch", "loss", "row", "drow", "max", "sum", "scale", "target", "total",
    "decay", "step_size", "bc2_sqrt", "denom", "d", "g", "r", "c", "i", "rng", "exp", "log", "sqrt",
    "pow", "expf", "logf", "tanhf", "sqrtf", "memset", "memcpy", "snprintf", "NULL", "INFINITY",
    /* locals of the rowwise, embedding and batched-matmul kernels (dialect_c.c) */
    "base", "j", "ib", "id", "query", "key", "out_row", "x_row", "y_row", "dy_row", "dot", "sum_sq", "mean", "rstd",
    "dxhat", "sum_dxhat", "sum_dxhat_xhat", "mean_dxhat", "mean_dxhat_xhat", "keys", "lane", "lanes", "inv_sum",
    "scaled_max",
    /* locals of elementwise expressions (ir/ops.def) */
    "tanh_inner",
};

static int is_reserved(const char *s) {
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
        if (strcmp(reserved[i], s) == 0) return 1;
    if (s[0] == 'i' && isdigit((unsigned char)s[1])) return 1;   /* loop indices */
    return strncmp(s, "dmrt", 4) == 0;
}

/* Every value gets a distinct C identifier derived from its source name (dots become
 * underscores; a clash gets the value's number as a suffix). A hash set keeps this
 * linear. */
static void assign_names(emitter *E) {
    const ir_graph *g = E->g;
    E->cname = calloc((size_t)g->n_values + 1, sizeof(char *));
    size_t n_slots = 64;
    while (n_slots < (size_t)g->n_values * 2 + 2) n_slots *= 2;
    char **taken = calloc(n_slots, sizeof(char *));
    if (!E->cname || !taken) abort();
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        char base[200];
        if (v->name) {
            size_t n = 0;
            for (const char *p = v->name; *p && n + 1 < sizeof base; p++)
                base[n++] = isalnum((unsigned char)*p) ? *p : '_';
            base[n] = 0;
            if (isdigit((unsigned char)base[0]) || n == 0) snprintf(base, sizeof base, "v_%.180s", v->name);
        } else {
            /* unnamed: the op and the value number, unique at once */
            snprintf(base, sizeof base, "%s_%d", ir_op_info_of(v->op)->name, i);
        }
        char name[256];
        snprintf(name, sizeof name, "%s%s", base, is_reserved(base) ? "_" : "");
        for (int suffix = i + 1;; suffix++) {
            size_t slot = ir_hash_string(name) & (n_slots - 1);
            while (taken[slot] && strcmp(taken[slot], name) != 0) slot = (slot + 1) & (n_slots - 1);
            if (!taken[slot]) {
                E->cname[i] = taken[slot] = strdup(name);
                break;
            }
            snprintf(name, sizeof name, "%s_%d", base, suffix);
        }
    }
    free(taken);
}

/* ---- small helpers --------------------------------------------------------------------- */

static const ir_value *V(const emitter *E, int id) { return E->g->values[id]; }

/* The type of value id as one rank holds it (the global type when unpartitioned). */
static const ir_type *T(const emitter *E, int id) { return &E->local[id]; }

/* A reshape planned to share its operand's buffer: no code, no buffer of its own. */
static int shares_buffer(const emitter *E, int id) { return E->plan->storage_of[id] != id; }

static const char *ctype(ir_dtype t) { return t == DT_I32 ? "int32_t" : "float"; }

static void shape_comment(const emitter *E, const ir_type *t, char *buf, size_t size) {
    ir_format_type(E->g, t, buf, size);
}

/* The .dm line of loc, trimmed and made safe inside a C comment. */
static void source_line(const emitter *E, int line, char *buf, size_t size) {
    const char *end = E->source_text + E->source_len;
    const char *p = line >= 1 && line <= E->n_lines ? E->source_text + E->line_start[line - 1] : end;
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    size_t n = 0;
    for (; p < end && *p != '\n' && n + 1 < size && n < 100; p++) {
        char c = *p;
        if (c == '*' && p + 1 < end && p[1] == '/') c = '+';
        buf[n++] = (c >= 32 && c < 127) ? c : ' ';
    }
    while (n && buf[n - 1] == ' ') n--;
    buf[n] = 0;
}

static void contiguous_strides(const ir_type *t, int64_t *stride) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        stride[d] = s;
        s *= t->shape[d];
    }
}

/* Merges adjacent dims that every array walks contiguously, and drops size-1 dims. */
static void coalesce(cg_loop_nest *k) {
    int r = 0;
    for (int d = 0; d < k->rank; d++) {
        if (k->size[d] == 1) continue;
        if (r > 0) {
            int mergeable = k->out_stride[r - 1] == k->out_stride[d] * k->size[d];
            for (int i = 0; i < k->n_in && mergeable; i++) mergeable = k->stride[i][r - 1] == k->stride[i][d] * k->size[d];
            if (mergeable) {
                k->size[r - 1] *= k->size[d];
                k->out_stride[r - 1] = k->out_stride[d];
                for (int i = 0; i < k->n_in; i++) k->stride[i][r - 1] = k->stride[i][d];
                continue;
            }
        }
        k->size[r] = k->size[d];
        k->out_stride[r] = k->out_stride[d];
        for (int i = 0; i < k->n_in; i++) k->stride[i][r] = k->stride[i][d];
        r++;
    }
    k->rank = r;
}

typedef struct literal {
    char text[64];
} literal;

/* Operand k of a loop nest: its buffer, or its value inline when it is a constant. */
static void set_operand(const emitter *E, cg_loop_nest *k, int slot, const char *var, int id, literal *lit) {
    k->var[slot] = var;
    if (V(E, id)->op == OP_CONST) {
        cg_float_literal(V(E, id)->scalar, lit->text, sizeof lit->text);
        k->constant[slot] = lit->text;
    } else {
        k->buffer[slot] = E->cname[id];
    }
}

/* ---- ops ------------------------------------------------------------------------------- */

static void emit_elementwise(emitter *E, const ir_value *v) {
    const ir_op_info *info = ir_op_info_of(v->op);
    cg_loop_nest k = {0};
    literal lits[CG_MAX_OPERANDS];
    k.rank = T(E, v->id)->rank;
    for (int d = 0; d < k.rank; d++) k.size[d] = T(E, v->id)->shape[d];
    contiguous_strides(T(E, v->id), k.out_stride);
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    static const char *const unary_vars[] = {"x", "y", "dy"};
    static const char *const binary_vars[] = {"a", "b"};
    if (info->cls == OPC_UNARY || info->cls == OPC_UNARY_GRAD) {
        k.expr = info->cls == OPC_UNARY ? info->forward : ir_op_info_of(v->unary)->backward;
        k.n_in = v->n_operands;
        for (int i = 0; i < k.n_in; i++) {
            set_operand(E, &k, i, unary_vars[i], v->operands[i], &lits[i]);
            contiguous_strides(T(E, v->id), k.stride[i]);
        }
    } else {
        k.expr = info->forward;
        k.n_in = 2;
        for (int i = 0; i < 2; i++) {
            const ir_type *t = T(E, v->operands[i]);
            int64_t own[IR_MAX_RANK];
            contiguous_strides(t, own);
            for (int d = 0; d < k.rank; d++) {
                int td = d - (k.rank - t->rank);
                k.stride[i][d] = td < 0 || t->shape[td] == 1 ? 0 : own[td];
            }
            set_operand(E, &k, i, binary_vars[i], v->operands[i], &lits[i]);
        }
    }
    coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* sum, mean, sum_to (big → small) and broadcast (small → big): the small tensor's
 * layout is the big one's with the dims in v->axes left out. */
static void emit_reduce_or_broadcast(emitter *E, const ir_value *v) {
    int is_broadcast = v->op == OP_BROADCAST;
    const ir_type *big = is_broadcast ? T(E, v->id) : T(E, v->operands[0]);
    cg_loop_nest k = {0};
    literal lit, scale;
    k.rank = big->rank;
    int64_t big_stride[IR_MAX_RANK], small_stride[IR_MAX_RANK], s = 1;
    contiguous_strides(big, big_stride);
    for (int d = big->rank - 1; d >= 0; d--) {
        int reduced = (v->axes >> d) & 1u;
        small_stride[d] = reduced ? 0 : s;
        if (!reduced) s *= big->shape[d];
    }
    for (int d = 0; d < k.rank; d++) k.size[d] = big->shape[d];
    k.n_in = 1;
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    if (is_broadcast) {
        memcpy(k.out_stride, big_stride, sizeof big_stride);
        memcpy(k.stride[0], small_stride, sizeof small_stride);
    } else {
        memcpy(k.out_stride, small_stride, sizeof small_stride);
        memcpy(k.stride[0], big_stride, sizeof big_stride);
        k.accumulate = 1;
        if (v->op == OP_MEAN) {
            /* the global count: a rank's share of a mean over a split dim is its partial sum
             * divided by every rank's elements, so the pending sum is the whole mean */
            cg_float_literal((double)ir_numel(&v->type) / (double)ir_numel(&V(E, v->operands[0])->type), scale.text,
                             sizeof scale.text);
            k.scale = scale.text;
        }
    }
    k.expr = "x";
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

static void emit_transpose(emitter *E, const ir_value *v) {
    const ir_type *in = T(E, v->operands[0]);
    cg_loop_nest k = {0};
    literal lit;
    int64_t in_stride[IR_MAX_RANK];
    contiguous_strides(in, in_stride);
    k.rank = T(E, v->id)->rank;
    for (int d = 0; d < k.rank; d++) {
        k.size[d] = T(E, v->id)->shape[d];
        k.stride[0][d] = in_stride[v->perm[d]];
    }
    contiguous_strides(T(E, v->id), k.out_stride);
    k.n_in = 1;
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    k.expr = "x";
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* A reshape into a buffer of its own: the elements in order. */
static void emit_copy(emitter *E, const ir_value *v) {
    cg_loop_nest k = {.rank = 1, .size = {ir_numel(T(E, v->id))}, .n_in = 1, .out = E->cname[v->id],
                      .out_stride = {1}, .out_elems = ir_numel(T(E, v->id)), .expr = "x"};
    literal lit;
    k.stride[0][0] = 1;
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    E->dialect->loop_nest(&E->w, &k);
}

static void emit_matmul(emitter *E, const ir_value *v) {
    const ir_type *a = T(E, v->operands[0]), *b = T(E, v->operands[1]);
    cg_gemm k = {.trans_a = v->trans_a, .trans_b = v->trans_b, .a = E->cname[v->operands[0]],
                 .b = E->cname[v->operands[1]], .c = E->cname[v->id], .batch = 1};
    int64_t a_cols = a->shape[a->rank - 1], a_rows = ir_numel(a) / a_cols;
    int64_t b_cols = b->shape[b->rank - 1], b_rows = ir_numel(b) / b_cols;
    if (v->batch_dims > 0) {
        /* one product per batch element, of the last two dims */
        for (int d = 0; d < v->batch_dims; d++) k.batch *= a->shape[d];
        a_rows = a->shape[a->rank - 2];
        b_rows = b->shape[b->rank - 2];
        k.batch_stride_a = a_rows * a_cols;
        k.batch_stride_b = b_rows * b_cols;
        k.batch_stride_c = ir_numel(T(E, v->id)) / k.batch;
    }
    k.lda = a_cols;
    k.ldb = b_cols;
    if (v->trans_a) {
        k.m = a_cols, k.k = a_rows;
        k.n = v->trans_b ? b_rows : b_cols;
    } else {
        k.m = a_rows, k.k = a_cols, k.n = v->trans_b ? b_rows : b_cols;
    }
    k.ldc = k.n;
    E->dialect->gemm(&E->w, &k);
}

/* slice copies a window of one dim; pad writes its operand into that window of zeros. */
static void emit_slice(emitter *E, const ir_value *v) {
    int pad = v->op == OP_PAD;
    const ir_type *small = pad ? T(E, v->operands[0]) : T(E, v->id);
    const ir_type *big = pad ? T(E, v->id) : T(E, v->operands[0]);
    int64_t small_stride[IR_MAX_RANK], big_stride[IR_MAX_RANK];
    contiguous_strides(small, small_stride);
    contiguous_strides(big, big_stride);
    cg_loop_nest k = {0};
    literal lit;
    k.rank = small->rank;
    for (int d = 0; d < k.rank; d++) k.size[d] = small->shape[d];
    k.n_in = 1;
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    k.expr = "x";
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    int64_t window = v->offset * big_stride[v->axis];
    memcpy(k.stride[0], pad ? small_stride : big_stride, sizeof small_stride);
    memcpy(k.out_stride, pad ? big_stride : small_stride, sizeof small_stride);
    if (pad) {
        k.out_offset = window;
        k.accumulate = 1; /* zeros first, then the window */
    } else {
        k.offset[0] = window;
    }
    coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* Softmax, its gradient, the causal mask and layernorm: the operand viewed as (outer,
 * n, inner) around the dim the op works along. */
static void emit_rowwise(emitter *E, const ir_value *v) {
    const ir_type *x = T(E, v->operands[0]);
    int axis = v->op == OP_SOFTMAX || v->op == OP_SOFTMAX_GRAD ? v->axis : x->rank - 1;
    if (v->op == OP_CAUSAL_MASK) axis = x->rank - 2;
    cg_rowwise k = {.outer = 1, .n = x->shape[axis], .inner = 1, .out = E->cname[v->id]};
    for (int d = 0; d < axis; d++) k.outer *= x->shape[d];
    for (int d = axis + 1; d < x->rank; d++) k.inner *= x->shape[d];
    char fill[64], eps[64];
    const char *operand[3] = {NULL, NULL, NULL};
    for (int i = 0; i < v->n_operands; i++) operand[i] = E->cname[v->operands[i]];
    char scale[64];
    if ((v->op == OP_SOFTMAX || v->op == OP_SOFTMAX_GRAD) && v->scalar != 1.0) {
        cg_float_literal(v->scalar, scale, sizeof scale);
        k.scale = scale;
    }
    if (v->causal) k.causal_queries = x->shape[x->rank - 2];
    switch (v->op) {
    case OP_SOFTMAX:
        k.x = operand[0];
        E->dialect->softmax(&E->w, &k);
        return;
    case OP_SOFTMAX_GRAD:
        k.y = operand[0], k.dy = operand[1];
        E->dialect->softmax_grad(&E->w, &k);
        return;
    case OP_CAUSAL_MASK:
        if (isinf(v->scalar)) snprintf(fill, sizeof fill, "%sINFINITY", v->scalar < 0 ? "-" : "");
        else cg_float_literal(v->scalar, fill, sizeof fill);
        k.x = operand[0], k.fill = fill;
        E->dialect->causal_mask(&E->w, &k);
        return;
    default:
        break;
    }
    cg_float_literal(v->scalar, eps, sizeof eps);
    k.eps = eps;
    k.x = operand[0];
    if (v->op == OP_LAYERNORM) {
        k.weight = operand[1], k.bias = operand[2];
        E->dialect->layernorm(&E->w, &k);
    } else if (v->op == OP_LAYERNORM_GRAD) {
        k.weight = operand[1], k.dy = operand[2];
        E->dialect->layernorm_grad(&E->w, &k);
    } else {
        k.dy = operand[1];
        E->dialect->layernorm_wgrad(&E->w, &k);
    }
}

static void emit_embed(emitter *E, const ir_value *v) {
    char where[300];
    snprintf(where, sizeof where, "%s:%d", E->source_path, v->loc.line);
    int grad = v->op == OP_EMBED_GRAD;
    const ir_type *table = grad ? T(E, v->id) : T(E, v->operands[0]);
    const ir_type *ids = T(E, v->operands[grad ? 0 : 1]);
    cg_embed k = {.rows = ir_numel(ids), .n = table->shape[0], .cols = table->shape[1], .out = E->cname[v->id],
                  .ids = E->cname[v->operands[grad ? 0 : 1]], .where = where};
    const ir_type *global_table = grad ? &v->type : &V(E, v->operands[0])->type;
    k.vocab = global_table->shape[0];
    char first_row[96];
    if (global_table->split[0] != IR_REPLICATED) {
        /* a vocabulary split over ranks: this rank holds rows [first_row, first_row + n) */
        snprintf(first_row, sizeof first_row, "ctx->coord[%d] * %lld", global_table->split[0], (long long)k.n);
        k.first_row = first_row;
    }
    if (grad) {
        k.dy = E->cname[v->operands[1]];
        E->dialect->embed_grad(&E->w, &k);
    } else {
        k.table = E->cname[v->operands[0]];
        E->dialect->embed(&E->w, &k);
    }
}

static int64_t axis_size(const emitter *E, int axis);

static void emit_loss(emitter *E, const ir_value *v, int grad) {
    const ir_type *logits = T(E, v->operands[0]);
    char where[300];
    snprintf(where, sizeof where, "%s:%d", E->source_path, v->loc.line);
    cg_xent k = {.classes = logits->shape[logits->rank - 1], .logits = E->cname[v->operands[0]],
                 .targets = E->cname[v->operands[1]], .out = E->cname[v->id], .where = where};
    k.rows = ir_numel(logits) / k.classes;
    /* the mean is over every rank's rows: split rows leave a pending sum of shares */
    k.mean_rows = ir_numel(&V(E, v->operands[0])->type) / V(E, v->operands[0])->type.shape[logits->rank - 1];
    k.all_classes = k.classes;
    int class_axis = ir_class_split_axis(E->g, v);
    char comm[48], coord[48];
    if (class_axis != IR_REPLICATED) {
        snprintf(comm, sizeof comm, "ctx->comm[%d]", class_axis);
        snprintf(coord, sizeof coord, "ctx->coord[%d]", class_axis);
        k.comm = comm, k.coord = coord, k.scratch = "ctx->scratch";
        k.comm_size = axis_size(E, class_axis);
        k.all_classes = k.classes * k.comm_size;
        k.logits_name = V(E, v->operands[0])->name ? V(E, v->operands[0])->name : E->cname[v->operands[0]];
    }
    char dloss[128];
    if (grad) {
        const ir_value *d = V(E, v->operands[2]);
        if (d->op == OP_CONST) cg_float_literal(d->scalar, dloss, sizeof dloss);
        else snprintf(dloss, sizeof dloss, "%s[0]", E->cname[d->id]);
        k.dloss = dloss;
        E->dialect->cross_entropy_grad(&E->w, &k);
    } else {
        E->dialect->cross_entropy(&E->w, &k);
    }
}

/* ---- collectives ------------------------------------------------------------------------ */

static int64_t axis_size(const emitter *E, int axis) { return E->g->axes[axis].size; }

/* Product of dims [from, to) of t. */
static int64_t dims_product(const ir_type *t, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= t->shape[d];
    return n;
}

/* A rearranging copy out[...] = x[...] over a loop nest of the given sizes and strides. */
static void emit_copy_nest(emitter *E, int rank, const int64_t *size, const char *in, const int64_t *in_stride,
                           const char *out, const int64_t *out_stride, int64_t elems) {
    cg_loop_nest k = {.rank = rank, .n_in = 1, .var = {"x"}, .buffer = {in}, .out = out, .out_elems = elems, .expr = "x"};
    for (int d = 0; d < rank; d++) {
        k.size[d] = size[d];
        k.stride[0][d] = in_stride[d];
        k.out_stride[d] = out_stride[d];
    }
    coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* The call of a collective, failing the step with the communicator's message. */
static void emit_comm_call(emitter *E, const ir_value *v, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void emit_comm_call(emitter *E, const ir_value *v, const char *fmt, ...) {
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const ir_value *src = V(E, v->operands[0]);
    cg_line(&E->w, "if (%s(ctx->comm[%d], %s, \"%s of %s (%s:%d)\") != 0) return comm_failed(ctx);",
            v->op == OP_ALLREDUCE ? "dmrt_allreduce_sum" : v->op == OP_ALLGATHER ? "dmrt_allgather"
            : v->op == OP_REDUCE_SCATTER ? "dmrt_reduce_scatter_sum" : "dmrt_alltoall",
            v->mesh_axis, args, ir_op_info_of(v->op)->name, src->name ? src->name : E->cname[src->id], E->source_path,
            v->loc.line);
}

/* How each collective moves blocks. A dim split over an axis of k ranks holds block c
 * (of k equal blocks) on the rank at coordinate c; communicators concatenate rank blocks
 * whole, so a dim that is not the outermost is rearranged through ctx->scratch:
 *   allreduce       copy, then sum in place.
 *   all-gather      gather [k, outer, block] into scratch, then interleave to [outer, k, block].
 *   reduce-scatter  [outer, k, block] to [k, outer, block] in scratch, then reduce-scatter.
 *   all-to-all      pack the k target blocks of the new split dim, exchange, unpack along
 *                   the old one.
 *   shard slice     copy this rank's block, at an offset known at run time. */
static void emit_collective(emitter *E, const ir_value *v) {
    const ir_type *in = T(E, v->operands[0]), *out = T(E, v->id);
    const char *x = E->cname[v->operands[0]], *y = E->cname[v->id];
    int64_t k = axis_size(E, v->mesh_axis), n_in = ir_numel(in), n_out = ir_numel(out);
    int i = v->axis;
    switch (v->op) {
    case OP_ALLREDUCE:
        cg_line(&E->w, "memcpy(%s, %s, %lld * sizeof(float));", y, x, (long long)n_in);
        emit_comm_call(E, v, "%s, %lld", y, (long long)n_in);
        return;
    case OP_ALLGATHER:
    case OP_REDUCE_SCATTER: {
        int gather = v->op == OP_ALLGATHER;
        const ir_type *whole = gather ? out : in;
        int64_t outer = dims_product(whole, 0, i), block = dims_product(whole, i, whole->rank) / k;
        if (outer == 1) {
            emit_comm_call(E, v, "%s, %s, %lld", x, y, (long long)(gather ? n_in : n_out));
            return;
        }
        /* (outer, k, block) in the whole tensor; (k, outer, block) in scratch */
        int64_t size[3] = {outer, k, block}, whole_stride[3] = {k * block, block, 1}, scratch_stride[3] = {block, outer * block, 1};
        if (gather) {
            emit_comm_call(E, v, "%s, ctx->scratch, %lld", x, (long long)n_in);
            emit_copy_nest(E, 3, size, "ctx->scratch", scratch_stride, y, whole_stride, n_out);
        } else {
            emit_copy_nest(E, 3, size, x, whole_stride, "ctx->scratch", scratch_stride, n_in);
            emit_comm_call(E, v, "ctx->scratch, %s, %lld", y, (long long)n_out);
        }
        return;
    }
    case OP_ALLTOALL: {
        /* in: dim i split (block of it), dim j whole; out: dim i whole, dim j split */
        int j = v->axis2, rank = in->rank;
        int64_t in_stride[IR_MAX_RANK], out_stride[IR_MAX_RANK];
        contiguous_strides(in, in_stride);
        contiguous_strides(out, out_stride);
        /* a message is in's shape with dim j cut to out's block of it, contiguous */
        ir_type msg = *in;
        msg.shape[j] = out->shape[j];
        int64_t msg_stride[IR_MAX_RANK], size[IR_MAX_RANK + 1], from[IR_MAX_RANK + 1], to[IR_MAX_RANK + 1];
        contiguous_strides(&msg, msg_stride);
        int64_t msg_elems = ir_numel(&msg);
        size[0] = k;
        for (int d = 0; d < rank; d++) size[d + 1] = msg.shape[d];
        /* pack: message r is in's block r of dim j */
        from[0] = msg.shape[j] * in_stride[j], to[0] = msg_elems;
        for (int d = 0; d < rank; d++) from[d + 1] = in_stride[d], to[d + 1] = msg_stride[d];
        emit_copy_nest(E, rank + 1, size, x, from, "ctx->scratch", to, n_in);
        char recv[64];
        snprintf(recv, sizeof recv, "(ctx->scratch + %lld)", (long long)n_in);
        emit_comm_call(E, v, "ctx->scratch, %s, %lld", recv, (long long)msg_elems);
        /* unpack: the message from rank r is out's block r of dim i */
        from[0] = msg_elems, to[0] = in->shape[i] * out_stride[i];
        for (int d = 0; d < rank; d++) from[d + 1] = msg_stride[d], to[d + 1] = out_stride[d];
        emit_copy_nest(E, rank + 1, size, recv, from, y, to, n_out);
        return;
    }
    case OP_SHARD_SLICE: {
        int64_t in_stride[IR_MAX_RANK], out_stride[IR_MAX_RANK];
        contiguous_strides(in, in_stride);
        contiguous_strides(out, out_stride);
        char block[160];
        snprintf(block, sizeof block, "(%s + ctx->coord[%d] * %lld)", x, v->mesh_axis, (long long)(out->shape[i] * in_stride[i]));
        emit_copy_nest(E, out->rank, out->shape, block, in_stride, y, out_stride, n_out);
        return;
    }
    default: break;
    }
}

/* Gradient buckets. The update phase allreduces each parameter's pending gradient over
 * an axis (data parallelism); gradients live in ctx->grads in declaration order, so a run
 * of consecutive parameters whose gradients are allreduced over the same axis is one
 * contiguous range: each partial is copied into its gradient's place and the range is
 * reduced by one call, up to GRAD_BUCKET_FLOATS (25 MiB; the first, holding the last
 * parameters, 1 MiB: PyTorch DDP's sizes; --bucket-mb changes the 25). Fewer, larger messages: each collective
 * synchronises the ranks once. The padding between gradients is zero and stays zero.
 *
 * A bucket whose partials are all complete before the backward pass ends is started
 * there, right after the last of them (dmrt_allreduce_start), and waited for at the end
 * of the pass: the backward pass computes the earlier layers' gradients in reverse order,
 * so the later layers' buckets are reduced while it goes on (where the backend can
 * overlap: docs/comm.md). Other buckets are reduced where the update reaches them. */
#define GRAD_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)
#define GRAD_FIRST_BUCKET_FLOATS ((int64_t)1024 * 1024 / 4)

static int grad_allreduce(const emitter *E, int p) {
    const ir_graph *g = E->g;
    if (!g->grads || g->grads[p] < 0) return 0;
    const ir_value *v = V(E, g->grads[p]);
    return v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE && E->plan->region[v->id] == REGION_GRADS;
}

static void plan_buckets(emitter *E) {
    const ir_graph *g = E->g;
    E->bucket_lead = malloc(((size_t)g->n_values + 1) * sizeof(int));
    E->bucket_ready = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!E->bucket_lead || !E->bucket_ready) abort();
    for (int i = 0; i < g->n_values; i++) E->bucket_lead[i] = E->bucket_ready[i] = -1;
    /* the last backward op: a bucket complete only then has nothing to overlap */
    int last_backward = -1;
    for (int i = 0; i < g->n_values; i++)
        if (V(E, i)->phase == PHASE_BACKWARD && ir_op_info_of(V(E, i)->op)->cls != OPC_SOURCE) last_backward = i;
    /* from the last parameter back, as the backward pass completes them; the first bucket
     * is small, so that the first reduction starts early (as DDP's) */
    int64_t cap = GRAD_FIRST_BUCKET_FLOATS < E->bucket_floats ? GRAD_FIRST_BUCKET_FLOATS : E->bucket_floats;
    for (int q = g->n_params; q > 0;) {
        if (!grad_allreduce(E, q - 1)) {
            q--;
            continue;
        }
        const ir_value *last = V(E, g->grads[q - 1]);
        int64_t floats = ir_numel(T(E, last->id));
        int p = q - 1; /* the bucket is parameters [p, q) */
        /* a bucket is one stage's: each stage updates its own parameters */
        while (p > 0 && grad_allreduce(E, p - 1) && V(E, g->grads[p - 1])->mesh_axis == last->mesh_axis &&
               V(E, g->grads[p - 1])->stage == last->stage &&
               floats + ir_numel(T(E, g->grads[p - 1])) <= cap) {
            floats += ir_numel(T(E, g->grads[p - 1]));
            p--;
        }
        /* the lead is the member the update phase reaches first */
        int first = g->grads[p], ready = -1, in_backward = 1;
        for (int k = p; k < q; k++) {
            if (g->grads[k] < first) first = g->grads[k];
            int partial = V(E, g->grads[k])->operands[0];
            if (partial > ready) ready = partial;
            if (V(E, partial)->phase != PHASE_BACKWARD) in_backward = 0;
        }
        for (int k = p; k < q; k++) E->bucket_lead[g->grads[k]] = first;
        if (in_backward && ready < last_backward) E->bucket_ready[first] = ready;
        cap = E->bucket_floats;
        q = p;
    }
}

/* Whether the bucket led by lead is started in the backward pass. */
static int bucket_started_early(const emitter *E, int lead) { return E->bucket_ready[lead] >= 0; }

/* Every member's partial into its gradient, then the range of ctx->grads from the first
 * member to the end of the last, reduced at once (started, when early). */
static void emit_bucket(emitter *E, const ir_value *lead) {
    const ir_graph *g = E->g;
    int64_t begin = -1, end = 0;
    const char *first_name = NULL, *last_name = NULL;
    int members = 0;
    for (int p = 0; p < g->n_params; p++) {
        int id = g->grads ? g->grads[p] : -1;
        if (id < 0 || E->bucket_lead[id] != lead->id) continue;
        const ir_value *v = V(E, id);
        cg_line(&E->w, "memcpy(%s, %s, %lld * sizeof(float));", E->cname[id], E->cname[v->operands[0]],
                (long long)ir_numel(T(E, id)));
        if (begin < 0) begin = E->plan->offset[id], first_name = V(E, g->params[p])->name;
        end = E->plan->offset[id] + ir_numel(T(E, id));
        last_name = V(E, g->params[p])->name;
        members++;
    }
    char label[300];
    if (members == 1) snprintf(label, sizeof label, "allreduce of the gradient of %s", first_name);
    else snprintf(label, sizeof label, "allreduce of the gradients %s .. %s (%d)", first_name, last_name, members);
    cg_line(&E->w, "if (%s(ctx->comm[%d], ctx->grads + %lld, %lld, \"%s\") != 0)",
            bucket_started_early(E, lead->id) ? "dmrt_allreduce_start" : "dmrt_allreduce_sum", lead->mesh_axis,
            (long long)begin, (long long)(end - begin), label);
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* In the backward pass, after value id: the bucket it completes (start_after: lead by
 * value, from bucket_ready) starts reducing. */
static void emit_bucket_start(emitter *E, const int *start_after, int id) {
    if (start_after[id] < 0) return;
    cg_line(&E->w, "/* every gradient of this bucket is complete: reduce it while the pass goes on */");
    emit_bucket(E, V(E, start_after[id]));
}

/* At the end of the backward pass: the started buckets, done (once per axis). */
static void emit_bucket_waits(emitter *E) {
    uint32_t axes = 0;
    for (int lead = 0; lead < E->g->n_values; lead++)
        if (bucket_started_early(E, lead)) axes |= 1u << V(E, lead)->mesh_axis;
    for (int a = 0; a < E->g->n_axes; a++)
        if (axes & (1u << a)) {
            cg_blank(&E->w);
            cg_line(&E->w, "/* the gradient buckets started above, reduced over %s */", E->g->axes[a].name);
            cg_line(&E->w, "if (dmrt_comm_wait(ctx->comm[%d]) != 0) return comm_failed(ctx);", a);
        }
}

/* Floats of ctx->scratch the collectives need at most: the whole tensor of a gather or
 * reduce-scatter, both message sets of an all-to-all. */
static int64_t scratch_need(const emitter *E) {
    int64_t need = 0;
    for (int id = 0; id < E->g->n_values; id++) {
        const ir_value *v = V(E, id);
        int64_t n = 0;
        if (v->op == OP_ALLGATHER) n = ir_numel(T(E, id));
        else if (v->op == OP_REDUCE_SCATTER) n = ir_numel(T(E, v->operands[0]));
        else if (v->op == OP_ALLTOALL) n = 2 * ir_numel(T(E, id));
        else if (ir_class_split_axis(E->g, v) != IR_REPLICATED) {
            /* row maxima of every rank, then the global maxima, sums and target logits */
            const ir_type *logits = T(E, v->operands[0]);
            int64_t rows = ir_numel(logits) / logits->shape[logits->rank - 1];
            n = (axis_size(E, ir_class_split_axis(E->g, v)) + 3) * rows;
        }
        if (n > need) need = n;
    }
    return need;
}

static void emit_update(emitter *E, const ir_value *v) {
    cg_update k = {.opt = &E->g->optimizer, .n = ir_numel(T(E, v->operands[0])),
                   .param = E->cname[v->operands[0]], .grad = E->cname[v->operands[1]]};
    if (v->n_operands > 2) k.state0 = E->cname[v->operands[2]];
    if (v->n_operands > 3) k.state1 = E->cname[v->operands[3]];
    if (v->op == OP_SGD_UPDATE) E->dialect->sgd(&E->w, &k);
    else E->dialect->adamw(&E->w, &k);
}

static void emit_op(emitter *E, const ir_value *v) {
    const ir_op_info *info = ir_op_info_of(v->op);
    if (info->cls == OPC_SOURCE) return;
    char line[160], type[256];
    source_line(E, v->loc.line, line, sizeof line);
    shape_comment(E, &v->type, type, sizeof type);
    cg_blank(&E->w);
    cg_line(&E->w, "/* %s:%d: %s */", E->source_path, v->loc.line, line);
    if (v->type.dtype == DT_VOID)
        cg_line(&E->w, "/* %s(%s) */", info->name, E->cname[v->operands[0]]);
    else
        cg_line(&E->w, "/* %s = %s : %s */", E->cname[v->id], info->name, type);
    switch (info->cls) {
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_BINARY: emit_elementwise(E, v); break;
    case OPC_REDUCE:
    case OPC_BROADCAST: emit_reduce_or_broadcast(E, v); break;
    case OPC_RESHAPE:
        if (shares_buffer(E, v->id))
            cg_line(&E->w, "/* %s shares the buffer of %s */", E->cname[v->id], E->cname[v->operands[0]]);
        else
            emit_copy(E, v);
        break;
    case OPC_TRANSPOSE: emit_transpose(E, v); break;
    case OPC_MATMUL: emit_matmul(E, v); break;
    case OPC_LOSS: emit_loss(E, v, 0); break;
    case OPC_LOSS_GRAD: emit_loss(E, v, 1); break;
    case OPC_UPDATE: emit_update(E, v); break;
    case OPC_SOFTMAX:
    case OPC_MASK:
    case OPC_NORM: emit_rowwise(E, v); break;
    case OPC_SLICE: emit_slice(E, v); break;
    case OPC_GATHER: emit_embed(E, v); break;
    case OPC_COLLECTIVE:
        if (v->op == OP_ALLREDUCE && E->bucket_lead[v->id] >= 0) {
            if (bucket_started_early(E, E->bucket_lead[v->id]))
                cg_line(&E->w, "/* reduced with its bucket during the backward pass */");
            else if (E->bucket_lead[v->id] == v->id) emit_bucket(E, v);
            else cg_line(&E->w, "/* reduced with its bucket, at %s */", E->cname[E->bucket_lead[v->id]]);
        } else {
            emit_collective(E, v);
        }
        break;
    case OPC_SOURCE: break;
    }
}

/* ---- phase functions ------------------------------------------------------------------- */

/* The first element of this rank's block of input id in the caller's whole batch: the
 * block of a split leading dim is contiguous (codegen_c refuses other splits). */
static void input_block(const emitter *E, int id, char *buf, size_t size) {
    const ir_type *t = &V(E, id)->type;
    int n = snprintf(buf, size, "batch->%s", E->cname[id]);
    if (E->in_micro && E->g->microbatches > 1 && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, " + micro * %lld", (long long)ir_numel(t));
    for (int d = 0; d < t->rank && n > 0 && (size_t)n < size; d++)
        if (t->split[d] != IR_REPLICATED)
            n += snprintf(buf + n, size - (size_t)n, " + ctx->coord[%d] * %lld", t->split[d],
                          (long long)(T(E, id)->shape[d] * dims_product(t, d + 1, t->rank)));
}

/* The pointer through which code reaches a value's storage. */
static void storage_expr(const emitter *E, int id, char *buf, size_t size) {
    const dm_memory_plan *p = E->plan;
    int root = p->storage_of[id];
    long long off = (long long)p->offset[id];
    switch (p->region[id]) {
    case REGION_INPUT: input_block(E, root, buf, size); break;
    case REGION_PARAMS: snprintf(buf, size, "ctx->params + %lld", off); break;
    case REGION_GRADS: snprintf(buf, size, "ctx->grads + %lld", off); break;
    case REGION_STATE: snprintf(buf, size, "ctx->state + %lld", off); break;
    case REGION_ARENA: snprintf(buf, size, "%s + %lld", E->arena_var, off); break;
    case REGION_NONE: snprintf(buf, size, "NULL"); break;
    }
}

static int has_storage(const emitter *E, int id) { return E->plan->region[id] != REGION_NONE; }

static void declare_buffers(emitter *E, const char *used) {
    const ir_graph *g = E->g;
    for (int i = 0; i < g->n_values; i++) {
        if (!used[i] || !has_storage(E, i)) continue;
        const ir_value *v = V(E, i);
        char where[128], type[256];
        storage_expr(E, i, where, sizeof where);
        shape_comment(E, &v->type, type, sizeof type);
        int readonly = E->plan->region[i] == REGION_INPUT;
        if (v->type.dtype == DT_I32 && E->plan->region[i] == REGION_ARENA)
            cg_line(&E->w, "%s%s *%s = (%s *)(%s); /* %s */", readonly ? "const " : "", ctype(v->type.dtype), E->cname[i],
                    ctype(v->type.dtype), where, type);
        else
            cg_line(&E->w, "%s%s *%s = %s; /* %s */", readonly ? "const " : "", ctype(v->type.dtype), E->cname[i], where, type);
    }
}

/* Whether op v reads operand k: a unary gradient reads only the variables its
 * expression names (relu's gradient needs x and dy, not y). */
static int operand_read(const ir_value *v, int k) {
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

/* The value whose gradient buffer one micro-batch's backward pass fills for parameter p:
 * the gradient itself, or the partial sum the update allreduces into it. */
static int micro_grad(const emitter *E, int p) {
    const ir_value *v = V(E, E->g->grads[p]);
    return v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE ? v->operands[0] : v->id;
}

/* Whether buffer owner r reaches `stage` from another stage in this phase's function:
 * forward values in the forward pass (even those only the backward reads), gradients in
 * the backward pass. */
static int received(const emitter *E, int r, ir_phase phase, int stage) {
    if (stage < 0 || E->plan->region[r] != REGION_ARENA || V(E, r)->stage == stage) return 0;
    if (!(E->needed_on[r] >> stage & 1)) return 0;
    return V(E, r)->phase == phase;
}

static void emit_transfer(emitter *E, int r, int peer, int send) {
    const ir_value *v = V(E, r);
    cg_line(&E->w, "if (dmrt_%s(ctx->comm[%d], %d, %s%s, %lld, \"%s of %s %s stage %d (%s:%d)\") != 0)", send ? "send" : "recv",
            E->pipe_axis, peer, v->type.dtype == DT_I32 ? "(float *)" : "", E->cname[r], (long long)ir_numel(T(E, r)),
            V(E, r)->phase == PHASE_FORWARD ? "activation" : "gradient", E->cname[r], send ? "to" : "from", peer,
            E->source_path, v->loc.line);
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* After op id in a stage's function: its result to the stages that read it. */
static void emit_sends(emitter *E, int id, int stage) {
    if (stage < 0 || E->plan->region[id] != REGION_ARENA || shares_buffer(E, id)) return;
    uint64_t to = E->needed_on[id] & ~((uint64_t)1 << stage);
    if (to) cg_line(&E->w, "/* %s, to the stages that read it */", E->cname[id]);
    for (int t = 0; t < E->stages; t++)
        if (to >> t & 1) emit_transfer(E, id, t, 1);
}

/* One phase as a function. stage < 0: every op (one step at once); else the ops of that
 * pipeline stage, for one micro-batch `micro` (forward and backward). */
static void emit_phase(emitter *E, ir_phase phase, int stage, const char *fn, const char *what) {
    const ir_graph *g = E->g;
    char *used = calloc((size_t)g->n_values + 1, 1);
    if (!used) abort();
    int any = 0, uses_batch = 0, micro = stage >= 0 && phase != PHASE_UPDATE;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->phase != phase || ir_op_info_of(v->op)->cls == OPC_SOURCE || (stage >= 0 && v->stage != stage)) continue;
        any = 1;
        /* a reshape that shares its operand's buffer emits no code: it touches nothing */
        if (shares_buffer(E, i)) continue;
        used[i] = v->type.dtype != DT_VOID;
        for (int k = 0; k < v->n_operands; k++)
            if (operand_read(v, k)) used[v->operands[k]] = 1;
    }
    /* the buckets started in this pass: their partials and gradients */
    for (int i = 0; phase == PHASE_BACKWARD && i < g->n_values; i++)
        if (E->bucket_lead[i] >= 0 && bucket_started_early(E, E->bucket_lead[i])) used[i] = used[V(E, i)->operands[0]] = 1;
    for (int i = 0; i < g->n_values; i++)
        if (received(E, i, phase, stage)) used[i] = any = 1;
    /* the micro-batch's gradients, summed; its loss and outputs, kept */
    int sums = micro && phase == PHASE_BACKWARD && g->microbatches > 1 && g->grads;
    for (int p = 0; sums && p < g->n_params; p++)
        if (V(E, g->params[p])->stage == stage) used[micro_grad(E, p)] = any = 1;
    int keeps = micro && phase == PHASE_FORWARD;
    if (keeps && g->loss >= 0 && V(E, g->loss)->stage == stage) used[g->loss] = 1;
    for (int i = 0; keeps && i < g->n_outputs; i++)
        if (V(E, g->outputs[i])->stage == stage) used[g->outputs[i]] = 1;
    for (int i = 0; i < g->n_values; i++)
        if (used[i] && has_storage(E, i) && E->plan->region[i] == REGION_INPUT) uses_batch = 1;
    cg_line(&E->w, "/* %s */", what);
    if (micro)
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch, int64_t micro) {", fn, g->model);
    else
        cg_line(&E->w, "static int %s(struct_ctx *ctx, const %s_batch *batch) {", fn, g->model);
    E->w.indent++;
    E->in_micro = micro;
    if (!uses_batch) cg_line(&E->w, "(void)batch;");
    if (!any) cg_line(&E->w, "(void)ctx;");
    int traced = micro && E->partitioned;
    if (stage >= 0 && any) {
        if (micro && E->slots[stage] > 1)
            cg_line(&E->w, "float *arena = ctx->arena + (micro %% %d) * %lld; /* this micro-batch's copy */", E->slots[stage],
                    (long long)E->plan->arena_elems);
        else
            cg_line(&E->w, "float *arena = ctx->arena;");
        E->arena_var = "arena";
    }
    if (micro) cg_line(&E->w, "(void)micro;");
    declare_buffers(E, used);
    for (int i = 0; i < g->n_values; i++)
        if (received(E, i, phase, stage)) emit_transfer(E, i, V(E, i)->stage, 0);
    /* the action starts when its inputs are here: waiting for them is the bubble */
    if (traced) cg_line(&E->w, "const double trace_start = dmrt_trace_now(ctx->rank);");
    /* a bucket's last partial is its own (partials are per gradient): one bucket per value */
    int *start_after = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!start_after) abort();
    for (int i = 0; i < g->n_values; i++) start_after[i] = -1;
    for (int lead = 0; phase == PHASE_BACKWARD && lead < g->n_values; lead++)
        if (bucket_started_early(E, lead)) start_after[E->bucket_ready[lead]] = lead;
    for (int i = 0; i < g->n_values; i++) {
        if (V(E, i)->phase == phase && (stage < 0 || V(E, i)->stage == stage)) {
            emit_op(E, V(E, i));
            emit_sends(E, i, stage);
        }
        emit_bucket_start(E, start_after, i);
    }
    free(start_after);
    if (phase == PHASE_BACKWARD) emit_bucket_waits(E);
    if (sums) {
        cg_blank(&E->w);
        cg_line(&E->w, "/* this micro-batch's gradients, summed over the step's (ctx->grad_sum is laid out as ctx->grads) */");
        for (int p = 0; p < g->n_params; p++)
            if (V(E, g->params[p])->stage == stage)
                cg_line(&E->w, "add_micro_grad(ctx->grad_sum + %lld, %s, %lld, micro);", (long long)E->plan->offset[g->grads[p]],
                        E->cname[micro_grad(E, p)], (long long)ir_numel(T(E, g->grads[p])));
    }
    if (keeps && g->loss >= 0 && V(E, g->loss)->stage == stage) {
        cg_blank(&E->w);
        cg_line(&E->w, "/* the step's loss: the mean of its micro-batches' */");
        cg_line(&E->w, "ctx->loss_sum = (micro == 0 ? 0.0 : ctx->loss_sum) + (double)%s[0];", E->cname[g->loss]);
    }
    for (int i = 0; keeps && i < g->n_outputs; i++) {
        int o = g->outputs[i];
        if (V(E, o)->stage != stage) continue;
        long long n = (long long)ir_numel(T(E, o));
        cg_line(&E->w, "memcpy(ctx->output_%s + micro * %lld, %s, %lld * sizeof(%s)); /* the step's output, by micro-batch */",
                E->cname[o], n, E->cname[o], n, ctype(V(E, o)->type.dtype));
    }
    if (traced) cg_line(&E->w, "dmrt_trace_action(ctx->rank, '%c', micro, trace_start);", phase == PHASE_FORWARD ? 'F' : 'B');
    cg_line(&E->w, "return DMRT_OK;");
    E->w.indent--;
    cg_line(&E->w, "}");
    cg_blank(&E->w);
    E->arena_var = "ctx->arena";
    E->in_micro = 0;
    free(used);
}

/* ---- files ----------------------------------------------------------------------------- */

/* A tensor as files and tools see it: a parameter in its stored shape. */
static void tensor_desc(emitter *E, const ir_value *v, const char *name) {
    char dims[256] = "";
    size_t n = 0;
    int rank = v->stored_rank ? v->stored_rank : v->type.rank;
    const int64_t *shape = v->stored_rank ? v->stored_shape : v->type.shape;
    /* a step's inputs and outputs hold every micro-batch */
    int64_t micro = v->op != OP_PARAM && E->g->microbatches > 1 ? E->g->microbatches : 1;
    for (int d = 0; d < rank; d++) {
        int k = snprintf(dims + n, sizeof dims - n, "%s%lld", d ? ", " : "", (long long)(shape[d] * (d ? 1 : micro)));
        if (k > 0) n += (size_t)k;
    }
    cg_line(&E->w, "{\"%s\", %s, %d, {%s}, %lld},", name, v->type.dtype == DT_I32 ? "DMRT_I32" : "DMRT_F32", rank,
            rank ? dims : "0", (long long)(ir_numel(&v->type) * micro));
}

static void emit_header(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model, *M = E->prefix_upper;
    cg_writer *w = &E->w;
    cg_line(w, "/* %s.h: generated by dmc from %s. Do not edit: change the .dm and recompile.", m, E->source_path);
    cg_line(w, " *");
    if (E->partitioned) {
        long long ranks = (long long)ir_mesh_ranks(g);
        char mesh[256] = "";
        size_t n = 0;
        for (int a = 0; a < g->n_axes; a++) {
            int k = snprintf(mesh + n, sizeof mesh - n, "%s%s=%lld", a ? " x " : "", g->axes[a].name, (long long)g->axes[a].size);
            if (k > 0 && (size_t)k < sizeof mesh - n) n += (size_t)k;
        }
        cg_line(w, " * One training step of the model, SPMD on the mesh %s (%lld ranks): every rank", mesh, ranks);
        cg_line(w, " * creates its context with %s_create_rank and calls the same functions in the same", m);
        cg_line(w, " * order; each holds its block of every split tensor and the communicators of dmrt_comm.h");
        cg_line(w, " * move data between them. Every function returns DMRT_OK (0) or a DMRT_ERR_* code with");
        cg_line(w, " * a message from %s_error().%s */", m,
                E->scheduled ? "\n *\n * A step runs its batch as micro-batches; the ranks of each pipeline stage run that\n"
                               " * stage's layers (dmc --explain shows the stages and the schedule)." : "");
    } else {
        cg_line(w, " * One training step of the model, on one device. Every function returns DMRT_OK (0) or");
        cg_line(w, " * a DMRT_ERR_* code with a message from %s_error(). Contexts are independent: any", m);
        cg_line(w, " * number may be used from different threads. */");
    }
    cg_line(w, "#ifndef %s_H", M);
    cg_line(w, "#define %s_H", M);
    cg_blank(w);
    cg_line(w, "#include <stdint.h>");
    cg_blank(w);
    cg_line(w, "#include \"dmrt.h\"");
    if (E->partitioned) cg_line(w, "#include \"dmrt_comm.h\"");
    cg_blank(w);
    cg_line(w, "#ifdef __cplusplus");
    cg_line(w, "extern \"C\" {");
    cg_line(w, "#endif");
    cg_blank(w);
    cg_line(w, "typedef struct %s_ctx %s_ctx;", m, m);
    cg_blank(w);
    if (E->partitioned)
        cg_line(w, "/* The inputs of one step, whole, row-major, in the shapes of %s: every rank passes the\n"
                   " * same batch and reads its own block of each split input. */", E->source_path);
    else
        cg_line(w, "/* The inputs of one step, row-major, in the shapes of %s. */", E->source_path);
    cg_line(w, "typedef struct %s_batch {", m);
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_value *v = V(E, g->inputs[i]);
        char type[256];
        shape_comment(E, &v->type, type, sizeof type);
        cg_line(w, "    const %s *%s; /* %s */", ctype(v->type.dtype), E->cname[v->id], type);
    }
    if (g->n_inputs == 0) cg_line(w, "    int unused; /* the model has no inputs */");
    cg_line(w, "} %s_batch;", m);
    cg_blank(w);
    if (E->partitioned) {
        cg_line(w, "/* This rank's context: joins the mesh (every rank of the run must call it; the run must");
        cg_line(w, " * have as many ranks as the mesh) and initialises parameters as the .dm says, from seed:");
        cg_line(w, " * the same seed gives the serial program's parameters, split. NULL on failure, with the");
        cg_line(w, " * message in err. */");
        cg_line(w, "%s_ctx *%s_create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen);", m, m);
    } else {
        cg_line(w, "/* A context with parameters initialised as the .dm says, from seed (the same seed gives");
        cg_line(w, " * the same parameters); NULL when out of memory. */");
        cg_line(w, "%s_ctx *%s_create(uint64_t seed);", m, m);
    }
    cg_line(w, "void %s_destroy(%s_ctx *ctx);", m, m);
    cg_blank(w);
    cg_line(w, "/* Parameters from/to a safetensors file, named as in the .dm (\"fc1.weight\"). Loading");
    cg_line(w, " * checks every name, dtype and shape and changes nothing on failure; saving is atomic.%s */",
            E->partitioned ? "\n * Files hold whole tensors: every rank loads its blocks; saving gathers them (every rank\n"
                             " * must call it) and world rank 0 writes the file" : "");
    cg_line(w, "int %s_load_weights(%s_ctx *ctx, const char *path);", m, m);
    cg_line(w, "int %s_save_weights(%s_ctx *ctx, const char *path);", m, m);
    cg_blank(w);
    cg_line(w, "/* The forward pass: the loss (if the model has one) into *loss (may be NULL). */");
    cg_line(w, "int %s_forward(%s_ctx *ctx, const %s_batch *batch, float *loss);", m, m, m);
    cg_line(w, "/* Forward, backward and optimizer update; the loss before the update into *loss. */");
    cg_line(w, "int %s_train_step(%s_ctx *ctx, const %s_batch *batch, float *loss);", m, m, m);
    cg_blank(w);
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        char type[256];
        shape_comment(E, &v->type, type, sizeof type);
        cg_line(w, "/* Output '%s' (%s) of the last forward or train_step; valid until the next call. */", v->name, type);
        cg_line(w, "const %s *%s_output_%s(const %s_ctx *ctx);", ctype(v->type.dtype), m, E->cname[v->id], m);
    }
    cg_blank(w);
    cg_line(w, "/* The last error message of ctx (\"\" if none). */");
    cg_line(w, "const char *%s_error(const %s_ctx *ctx);", m, m);
    cg_blank(w);
    cg_line(w, "/* Shapes, names and entry points for generic tools (dmrt_trainer_main). */");
    cg_line(w, "extern const dmrt_model %s_model;", m);
    cg_blank(w);
    cg_line(w, "#ifdef __cplusplus");
    cg_line(w, "}");
    cg_line(w, "#endif");
    cg_line(w, "#endif");
}

static int is_split(const ir_type *t) {
    for (int d = 0; d < t->rank; d++)
        if (t->split[d] != IR_REPLICATED) return 1;
    return 0;
}

static void emit_init(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* Initial parameters: each from its own random stream, so that adding a parameter");
    cg_line(w, " * leaves the others' values unchanged.%s */",
            E->partitioned ? " A split parameter is drawn whole and the rank keeps its\n * block, so every mesh starts from the serial program's values" : "");
    cg_line(w, "static int init_params(struct_ctx *ctx, uint64_t seed) {");
    w->indent++;
    cg_line(w, "dmrt_rng rng;");
    if (g->n_params == 0) cg_line(w, "(void)ctx; (void)seed; (void)rng;");
    for (int p = 0; p < g->n_params; p++) {
        const ir_value *v = V(E, g->params[p]);
        int split = is_split(&v->type);
        long long n = (long long)ir_numel(&v->type), off = (long long)E->plan->offset[v->id];
        char a[64], b[64], dst[96];
        if (split) snprintf(dst, sizeof dst, "whole");
        else snprintf(dst, sizeof dst, "ctx->params + %lld", off);
        cg_line(w, "/* %s */", v->name);
        cg_line(w, "dmrt_rng_init(&rng, seed, %d);", p);
        if (split) {
            cg_line(w, "{");
            w->indent++;
            cg_line(w, "float *whole = dmrt_alloc(%lld * sizeof(float));", n);
            cg_line(w, "if (!whole) return DMRT_ERR_NOMEM;");
        }
        switch (v->init.kind) {
        case INIT_ZEROS: cg_line(w, "dmrt_fill_const(%s, %lld, 0.0f);", dst, n); break;
        case INIT_ONES: cg_line(w, "dmrt_fill_const(%s, %lld, 1.0f);", dst, n); break;
        case INIT_NORMAL:
            cg_float_literal(v->init.a, a, sizeof a);
            cg_float_literal(v->init.b, b, sizeof b);
            cg_line(w, "dmrt_fill_normal(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        case INIT_UNIFORM:
            cg_float_literal(v->init.a, a, sizeof a);
            cg_float_literal(v->init.b, b, sizeof b);
            cg_line(w, "dmrt_fill_uniform(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        case INIT_XAVIER: {
            /* glorot uniform: bound sqrt(6 / (fan_in + fan_out)), fans of the last two dims
             * (of the stored shape, the one a checkpoint's author saw) */
            ir_type stored = v->type;
            if (v->stored_rank) {
                stored.rank = v->stored_rank;
                for (int d = 0; d < stored.rank; d++) stored.shape[d] = v->stored_shape[d];
            }
            const ir_type *t = &stored;
            double rf = 1, fan_in, fan_out;
            for (int d = 0; d + 2 < t->rank; d++) rf *= (double)t->shape[d];
            fan_in = t->rank >= 2 ? (double)t->shape[t->rank - 2] * rf : (double)t->shape[0];
            fan_out = t->rank >= 2 ? (double)t->shape[t->rank - 1] * rf : (double)t->shape[0];
            double bound = sqrt(6.0 / (fan_in + fan_out));
            cg_float_literal(-bound, a, sizeof a);
            cg_float_literal(bound, b, sizeof b);
            cg_line(w, "dmrt_fill_uniform(%s, %lld, %s, %s, &rng);", dst, n, a, b);
            break;
        }
        }
        if (split) {
            cg_line(w, "scatter_param(ctx, %d, whole);", p);
            cg_line(w, "dmrt_free(whole);");
            w->indent--;
            cg_line(w, "}");
        }
    }
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The mesh, the split of every parameter and gradient, and the block moves between a
 * rank's shard and the whole tensor (initialisation, loading, saving). */
static void emit_spmd_support(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int n_axes = g->n_axes;
    cg_line(w, "/* The mesh this code was compiled for: %lld ranks, row-major (the last axis varies fastest). */",
            (long long)ir_mesh_ranks(g));
    cg_line(w, "static const char *const mesh_axis_names[%d] = {", n_axes);
    for (int a = 0; a < n_axes; a++) cg_line(w, "    \"%s\",", g->axes[a].name);
    cg_line(w, "};");
    cg_line(w, "static const int64_t mesh_axis_sizes[%d] = {", n_axes);
    for (int a = 0; a < n_axes; a++) cg_line(w, "    %lld,", (long long)g->axes[a].size);
    cg_line(w, "};");
    for (int grad = 0; grad < 2; grad++) {
        if (grad && !g->grads) break;
        cg_line(w, "/* The mesh axis splitting each dim of each %s (-1: whole on every rank). */", grad ? "gradient" : "parameter");
        cg_line(w, "static const int8_t %s_split[%d][%d] = {", grad ? "grad" : "param", g->n_params ? g->n_params : 1, IR_MAX_RANK);
        for (int p = 0; p < g->n_params; p++) {
            const ir_type *t = &V(E, grad ? g->grads[p] : g->params[p])->type;
            char row[128] = "";
            size_t n = 0;
            for (int d = 0; d < IR_MAX_RANK; d++) {
                int k = snprintf(row + n, sizeof row - n, "%s%d", d ? ", " : "", d < t->rank ? t->split[d] : -1);
                if (k > 0) n += (size_t)k;
            }
            cg_line(w, "    {%s}, /* %s */", row, V(E, g->params[p])->name);
        }
        if (!g->n_params) cg_line(w, "    {0},");
        cg_line(w, "};");
    }
    if (E->pipe_axis >= 0) {
        cg_line(w, "/* The mesh axis of the pipeline's stages, and the stage holding each parameter. */");
        cg_line(w, "#define PIPELINE_AXIS %d", E->pipe_axis);
        cg_line(w, "static const int param_stage[%d] = {", g->n_params ? g->n_params : 1);
        for (int p = 0; p < g->n_params; p++) cg_line(w, "    %d, /* %s */", V(E, g->params[p])->stage, V(E, g->params[p])->name);
        if (!g->n_params) cg_line(w, "    0,");
        cg_line(w, "};");
    }
    cg_line(w, "/* Each parameter's shape in the program (its stored shape may merge dims): rank, dims. */");
    cg_line(w, "static const int64_t param_shapes[%d][%d] = {", g->n_params ? g->n_params : 1, IR_MAX_RANK + 1);
    for (int p = 0; p < g->n_params; p++) {
        const ir_type *t = &V(E, g->params[p])->type;
        char row[256];
        size_t n = (size_t)snprintf(row, sizeof row, "%d", t->rank);
        for (int d = 0; d < t->rank && n < sizeof row; d++) n += (size_t)snprintf(row + n, sizeof row - n, ", %lld", (long long)t->shape[d]);
        cg_line(w, "    {%s},", row);
    }
    if (!g->n_params) cg_line(w, "    {0},");
    cg_line(w, "};");
    cg_blank(w);
    cg_line(w, "/* The block of parameter p (or its gradient, split as given) that this rank holds. */");
    cg_line(w, "static void rank_block(const struct_ctx *ctx, int p, const int8_t *split, int64_t *start, int64_t *block) {");
    cg_line(w, "    const int64_t *shape = param_shapes[p] + 1;");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) {");
    cg_line(w, "        block[d] = split[d] < 0 ? shape[d] : shape[d] / mesh_axis_sizes[split[d]];");
    cg_line(w, "        start[d] = split[d] < 0 ? 0 : ctx->coord[split[d]] * block[d];");
    cg_line(w, "    }");
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* Parameter p's block of the whole tensor into this rank's shard. */");
    cg_line(w, "static void scatter_param(struct_ctx *ctx, int p, const float *whole) {");
    cg_line(w, "    int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "    rank_block(ctx, p, param_split[p], start, block);");
    cg_line(w, "    dmrt_block_read(whole, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, ctx->params + param_offsets[p]);");
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* Parameter p (or its gradient), whole, on every rank: each rank writes its block into");
    cg_line(w, " * zeros and the blocks are summed over the axes that split it (x + 0 is exact). Every");
    cg_line(w, " * rank must call it. */");
    cg_line(w, "static int gather_param(struct_ctx *ctx, int p, int grad, float *whole) {");
    w->indent++;
    cg_line(w, "const dmrt_tensor_desc *desc = &param_descs[p];");
    if (g->grads) cg_line(w, "const int8_t *split = grad ? grad_split[p] : param_split[p];");
    else cg_line(w, "const int8_t *split = param_split[p];");
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, split, start, block);");
    cg_line(w, "memset(whole, 0, (size_t)desc->numel * sizeof(float));");
    if (g->grads) cg_line(w, "const float *shard = grad ? ctx->grads + grad_offsets[p] : ctx->params + param_offsets[p];");
    else cg_line(w, "const float *shard = grad ? NULL : ctx->params + param_offsets[p];");
    cg_line(w, "if (!shard) return DMRT_ERR_ARG;");
    if (E->pipe_axis >= 0) {
        cg_line(w, "/* only the parameter's stage has its values (the others add zeros) */");
        cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == param_stage[p])");
        cg_line(w, "    dmrt_block_write(shard, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, whole);");
    } else {
        cg_line(w, "dmrt_block_write(shard, (int)param_shapes[p][0], param_shapes[p] + 1, block, start, whole);");
    }
    cg_line(w, "for (int axis = 0; axis < %d; axis++) {", n_axes);
    cg_line(w, "    int splits = %s;", E->pipe_axis >= 0 ? "axis == PIPELINE_AXIS" : "0");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) splits |= split[d] == axis;");
    cg_line(w, "    if (splits && dmrt_allreduce_sum(ctx->comm[axis], whole, desc->numel, desc->name) != 0) return comm_failed(ctx);");
    cg_line(w, "}");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* ---- micro-batches and pipeline stages --------------------------------------------------- */

/* The schedule, the slots per stage and which stages read each buffer. */
static void plan_stages(emitter *E) {
    const ir_graph *g = E->g;
    if (pipe_schedule_build(&E->sched, pipe_kind_for(g->schedule, E->stages), E->stages, g->microbatches, 1.0, 2.0))
        abort();
    E->slots = calloc((size_t)E->stages, sizeof(int));
    E->needed_on = calloc((size_t)g->n_values + 1, sizeof(uint64_t));
    if (!E->slots || !E->needed_on) abort();
    for (int st = 0; st < E->stages; st++) E->slots[st] = pipe_in_flight(&E->sched, st);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (ir_op_info_of(v->op)->cls == OPC_SOURCE || shares_buffer(E, i) || v->stage >= 64) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (operand_read(v, k)) E->needed_on[E->plan->storage_of[v->operands[k]]] |= (uint64_t)1 << v->stage;
    }
}

/* Stage s's functions (forward and backward of one micro-batch, its update), then its
 * actions in the schedule's order as straight-line code: the grid of --explain, row s. */
static void emit_stages(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int trains = g->loss >= 0 && g->grads, M = g->microbatches;
    cg_line(w, "/* Micro-batches whose temporaries each stage holds at once (%s): a copy of the arena each. */",
            E->stages > 1 ? pipe_kind_name(E->sched.kind) : "one after the other");
    cg_line(w, "static const int stage_slots[%d] = {", E->stages);
    for (int st = 0; st < E->stages; st++) cg_line(w, "    %d,", E->slots[st]);
    cg_line(w, "};");
    if (trains && M > 1) {
        cg_line(w, "/* sum (n) += grad, or = grad for the first micro-batch */");
        cg_line(w, "static void add_micro_grad(float *sum, const float *grad, int64_t n, int64_t micro) {");
        cg_line(w, "    if (micro == 0) memcpy(sum, grad, (size_t)n * sizeof(float));");
        cg_line(w, "    else for (int64_t i = 0; i < n; i++) sum[i] += grad[i];");
        cg_line(w, "}");
        cg_line(w, "/* grad (n) = sum / micro-batches: each micro-batch's loss is a mean over its rows, the step's over all */");
        cg_line(w, "static void mean_micro_grad(float *grad, const float *sum, int64_t n) {");
        cg_line(w, "    for (int64_t i = 0; i < n; i++) grad[i] = sum[i] * (1.0f / %d.0f);", M);
        cg_line(w, "}");
    }
    cg_blank(w);
    for (int st = 0; st < E->stages; st++) {
        char fn[64], what[256];
        int first = -1, last = -1;
        for (int i = 0; i < g->n_values; i++)
            if (V(E, i)->phase == PHASE_FORWARD && V(E, i)->stage == st && ir_op_info_of(V(E, i)->op)->cls != OPC_SOURCE) {
                if (first < 0) first = i;
                last = i;
            }
        snprintf(fn, sizeof fn, "stage%d_forward", st);
        snprintf(what, sizeof what, "Stage %d's forward pass of micro-batch `micro` (%s lines %d to %d).", st, E->source_path,
                 first >= 0 ? V(E, first)->loc.line : 0, last >= 0 ? V(E, last)->loc.line : 0);
        emit_phase(E, PHASE_FORWARD, st, fn, what);
        if (trains) {
            snprintf(fn, sizeof fn, "stage%d_backward", st);
            snprintf(what, sizeof what, "Stage %d's backward pass of micro-batch `micro`.", st);
            emit_phase(E, PHASE_BACKWARD, st, fn, what);
            if (g->optimizer.kind != OPTIM_NONE) {
                snprintf(fn, sizeof fn, "stage%d_update", st);
                snprintf(what, sizeof what, "Stage %d's optimizer update of its parameters (ctx->step already counts it).", st);
                emit_phase(E, PHASE_UPDATE, st, fn, what);
            }
        }
        /* forward only: the micro-batches in order */
        cg_line(w, "/* Stage %d's forward pass of the step's %d micro-batch%s. */", st, M, M == 1 ? "" : "es");
        cg_line(w, "static int stage%d_infer(struct_ctx *ctx, const %s_batch *batch) {", st, g->model);
        cg_line(w, "    for (int64_t micro = 0; micro < %d; micro++) {", M);
        cg_line(w, "        int status = stage%d_forward(ctx, batch, micro);", st);
        cg_line(w, "        if (status != DMRT_OK) return status;");
        cg_line(w, "    }");
        cg_line(w, "    return DMRT_OK;");
        cg_line(w, "}");
        cg_blank(w);
        if (!trains) continue;
        cg_line(w, "/* Stage %d's forward and backward passes of the step: %s, %d stage%s, %d micro-batch%s; dmc --explain",
                st, E->stages > 1 ? pipe_kind_name(E->sched.kind) : "accumulation", E->stages, E->stages == 1 ? "" : "s", M,
                M == 1 ? "" : "es");
        cg_line(w, " * draws every stage's actions as a grid. */");
        cg_line(w, "static int stage%d_train(struct_ctx *ctx, const %s_batch *batch) {", st, g->model);
        w->indent++;
        cg_line(w, "int status;");
        for (int i = 0; i < 2 * M; i++) {
            const pipe_action *a = pipe_action_at(&E->sched, st, i);
            cg_line(w, "if ((status = stage%d_%s(ctx, batch, %d)) != DMRT_OK) return status;", st,
                    a->kind == 'F' ? "forward" : "backward", a->micro);
        }
        int any = 0;
        for (int p = 0; M > 1 && p < g->n_params; p++)
            if (V(E, g->params[p])->stage == st) {
                if (!any) cg_line(w, "/* the step's gradients: the mean of the micro-batches' */");
                any = 1;
                char where[128];
                storage_expr(E, micro_grad(E, p), where, sizeof where);
                cg_line(w, "mean_micro_grad(%s, ctx->grad_sum + %lld, %lld); /* %s */", where,
                        (long long)E->plan->offset[g->grads[p]], (long long)ir_numel(T(E, g->grads[p])),
                        V(E, g->params[p])->name);
            }
        cg_line(w, "return DMRT_OK;");
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
    }
}

/* The head of <model>_train_step; for a model without a loss, all of its body: 0. */
static int open_train_step(emitter *E) {
    const char *m = E->g->model;
    cg_line(&E->w, "int %s_train_step(%s_ctx *ctx, const %s_batch *batch, float *loss) {", m, m, m);
    E->w.indent++;
    if (E->g->loss >= 0 && E->g->grads) return 1;
    cg_line(&E->w, "(void)batch; (void)loss;");
    cg_line(&E->w, "snprintf(ctx->error, sizeof ctx->error, \"%s: the model has no loss to minimize\");", m);
    cg_line(&E->w, "return DMRT_ERR_ARG;");
    return 0;
}

/* `call` (stage%d_NAME) of this rank's stage. */
static void emit_stage_dispatch(emitter *E, const char *what, const char *args) {
    cg_writer *w = &E->w;
    if (E->stages == 1) {
        cg_line(w, "status = stage0_%s(%s);", what, args);
        return;
    }
    cg_line(w, "switch (ctx->coord[PIPELINE_AXIS]) {");
    for (int st = 0; st < E->stages; st++) cg_line(w, "case %d: status = stage%d_%s(%s); break;", st, st, what, args);
    cg_line(w, "default: status = DMRT_ERR_ARG; break;");
    cg_line(w, "}");
}

static void emit_scheduled_api(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    cg_line(w, "/* The step's loss and outputs, on every rank: the stage computing each sends it to the others%s. */",
            E->stages > 1 ? " (an allreduce\n * over the pipeline axis of the value and zeros: x + 0 is exact)" : "");
    cg_line(w, "static int finish_forward(struct_ctx *ctx, float *loss) {");
    w->indent++;
    if (g->loss >= 0) {
        if (E->stages > 1)
            cg_line(w, "ctx->loss = ctx->coord[PIPELINE_AXIS] == %d ? (float)(ctx->loss_sum / %d.0) : 0.0f;",
                    V(E, g->loss)->stage, g->microbatches);
        else
            cg_line(w, "ctx->loss = (float)(ctx->loss_sum / %d.0);", g->microbatches);
    } else {
        cg_line(w, "ctx->loss = 0.0f; /* the model declares no loss */");
    }
    if (E->stages > 1) {
        if (g->loss >= 0)
            cg_line(w, "if (dmrt_allreduce_sum(ctx->comm[PIPELINE_AXIS], &ctx->loss, 1, \"the loss, from its stage\") != 0) return comm_failed(ctx);");
        for (int i = 0; i < g->n_outputs; i++) {
            int o = g->outputs[i];
            long long n = (long long)(g->microbatches * ir_numel(T(E, o)));
            cg_line(w, "if (ctx->coord[PIPELINE_AXIS] != %d) memset(ctx->output_%s, 0, %lld * sizeof(float));", V(E, o)->stage,
                    E->cname[o], n);
            cg_line(w, "if (dmrt_allreduce_sum(ctx->comm[PIPELINE_AXIS], (float *)ctx->output_%s, %lld, \"output %s, from its stage\") != 0)",
                    E->cname[o], n, V(E, o)->name);
            cg_line(w, "    return comm_failed(ctx);");
        }
    }
    cg_line(w, "if (loss) *loss = ctx->loss;");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "int %s_forward(%s_ctx *ctx, const %s_batch *batch, float *loss) {", m, m, m);
    w->indent++;
    cg_line(w, "ctx->error[0] = 0;");
    cg_line(w, "int status;");
    emit_stage_dispatch(E, "infer", "ctx, batch");
    cg_line(w, "if (status != DMRT_OK) return status;");
    cg_line(w, "return finish_forward(ctx, loss);");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (open_train_step(E)) {
        cg_line(w, "ctx->error[0] = 0;");
        cg_line(w, "int status;");
        emit_stage_dispatch(E, "train", "ctx, batch");
        cg_line(w, "if (status == DMRT_OK) status = finish_forward(ctx, loss);");
        cg_line(w, "if (status != DMRT_OK) return status;");
        if (g->optimizer.kind != OPTIM_NONE) {
            cg_line(w, "ctx->step++;");
            emit_stage_dispatch(E, "update", "ctx, batch");
        }
        cg_line(w, "return status;");
    }
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        cg_line(w, "const %s *%s_output_%s(const %s_ctx *ctx) {", ctype(v->type.dtype), m, E->cname[v->id], m);
        cg_line(w, "    return ctx->output_%s;", E->cname[v->id]);
        cg_line(w, "}");
        cg_blank(w);
    }
}

static void emit_source(emitter *E) {
    const ir_graph *g = E->g;
    const dm_memory_plan *P = E->plan;
    const char *m = g->model;
    cg_writer *w = &E->w;
    int has_loss = g->loss >= 0, trains = g->loss >= 0 && g->grads;
    cg_line(w, "/* %s.c: generated by dmc from %s. Do not edit: change the .dm and recompile. */", m, E->source_path);
    cg_line(w, "#include \"%s.h\"", m);
    cg_blank(w);
    cg_line(w, "#include <math.h>");
    cg_line(w, "#include <stdio.h>");
    cg_line(w, "#include <stdlib.h>");
    cg_line(w, "#include <string.h>");
    cg_blank(w);
    cg_line(w, "/* glibc's libmvec (2.35 and later, linked through -lm) has vector versions of these:");
    cg_line(w, " * declaring them lets gcc vectorise the loops that call them (GELU, softmax). */");
    cg_line(w, "#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \\");
    cg_line(w, "    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))");
    cg_line(w, "float tanhf(float) __attribute__((simd(\"notinbranch\")));");
    cg_line(w, "float expf(float) __attribute__((simd(\"notinbranch\")));");
    cg_line(w, "#endif");
    cg_blank(w);
    cg_line(w, "/* Storage of one rank, planned by dmc (elements of 4 bytes). */");
    cg_line(w, "struct %s_ctx {", m);
    cg_line(w, "    float *params; /* (%lld) every parameter, in declaration order */", (long long)P->param_elems);
    cg_line(w, "    float *grads;  /* (%lld) gradient of each parameter after train_step */", (long long)P->grad_elems);
    cg_line(w, "    float *state;  /* (%lld) optimizer state */", (long long)P->state_elems);
    if (E->scheduled) {
        cg_line(w, "    float *arena;  /* (stage_slots[stage], %lld) temporaries of one micro-batch, reused by liveness (%lld",
                (long long)P->arena_elems, (long long)P->arena_unshared_elems);
        cg_line(w, "                    * without reuse): a copy for each micro-batch in flight on this rank's stage */");
        if (trains && g->microbatches > 1)
            cg_line(w, "    float *grad_sum; /* (%lld) the micro-batches' gradients, summed; laid out as grads */", (long long)P->grad_elems);
        cg_line(w, "    double loss_sum; /* the micro-batches' losses, summed */");
        cg_line(w, "    float loss;      /* the step's: their mean */");
        for (int i = 0; i < g->n_outputs; i++)
            cg_line(w, "    %s *output_%s; /* (%d, %lld) output %s of the step, by micro-batch */", ctype(V(E, g->outputs[i])->type.dtype),
                    E->cname[g->outputs[i]], g->microbatches, (long long)ir_numel(T(E, g->outputs[i])), V(E, g->outputs[i])->name);
    } else {
        cg_line(w, "    float *arena;  /* (%lld) temporaries of one step, reused by liveness (%lld without reuse) */",
                (long long)P->arena_elems, (long long)P->arena_unshared_elems);
    }
    cg_line(w, "    int64_t step;  /* optimizer updates done */");
    if (E->partitioned) {
        cg_line(w, "    dmrt_rank *rank;           /* this rank of the run (the launcher's) */");
        cg_line(w, "    dmrt_comm *comm[%d];        /* (mesh axes) the ranks differing from this one along each axis */", g->n_axes);
        cg_line(w, "    int64_t coord[%d];          /* (mesh axes) this rank's coordinate: the block of a split dim it holds */", g->n_axes);
        cg_line(w, "    float *scratch;            /* (%lld) collectives rearrange blocks here */", (long long)E->scratch_elems);
    }
    cg_line(w, "    char error[512];");
    cg_line(w, "};");
    cg_line(w, "typedef struct %s_ctx struct_ctx;", m);
    cg_blank(w);
    if (E->partitioned) {
        cg_line(w, "/* A failed collective fails the step with the communicator's message (rank, axis, op, step). */");
        cg_line(w, "static int comm_failed(struct_ctx *ctx) {");
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%%s\", dmrt_rank_error(ctx->rank));");
        cg_line(w, "    return DMRT_ERR_COMM;");
        cg_line(w, "}");
        cg_blank(w);
    }
    cg_line(w, "static const dmrt_tensor_desc input_descs[%d] = {", g->n_inputs ? g->n_inputs : 1);
    w->indent++;
    for (int i = 0; i < g->n_inputs; i++) tensor_desc(E, V(E, g->inputs[i]), V(E, g->inputs[i])->name);
    if (!g->n_inputs) cg_line(w, "{\"\", DMRT_F32, 0, {0}, 0},");
    w->indent--;
    cg_line(w, "};");
    cg_line(w, "static const dmrt_tensor_desc param_descs[%d] = {", g->n_params ? g->n_params : 1);
    w->indent++;
    for (int p = 0; p < g->n_params; p++) tensor_desc(E, V(E, g->params[p]), V(E, g->params[p])->name);
    if (!g->n_params) cg_line(w, "{\"\", DMRT_F32, 0, {0}, 0},");
    w->indent--;
    cg_line(w, "};");
    cg_line(w, "static const dmrt_tensor_desc output_descs[%d] = {", g->n_outputs ? g->n_outputs : 1);
    w->indent++;
    for (int i = 0; i < g->n_outputs; i++) tensor_desc(E, V(E, g->outputs[i]), V(E, g->outputs[i])->name);
    if (!g->n_outputs) cg_line(w, "{\"\", DMRT_F32, 0, {0}, 0},");
    w->indent--;
    cg_line(w, "};");
    cg_line(w, "/* Offset of each parameter (and of its gradient) in ctx->params (ctx->grads). */");
    cg_line(w, "static const int64_t param_offsets[%d] = {", g->n_params ? g->n_params : 1);
    for (int p = 0; p < g->n_params; p++) cg_line(w, "    %lld,", (long long)P->offset[g->params[p]]);
    if (!g->n_params) cg_line(w, "    0,");
    cg_line(w, "};");
    if (trains) {
        cg_line(w, "static const int64_t grad_offsets[%d] = {", g->n_params ? g->n_params : 1);
        for (int p = 0; p < g->n_params; p++) cg_line(w, "    %lld,", (long long)P->offset[g->grads[p]]);
        if (!g->n_params) cg_line(w, "    0,");
        cg_line(w, "};");
    }
    cg_blank(w);
    if (E->partitioned) emit_spmd_support(E);
    emit_init(E);
    if (E->scheduled) {
        emit_stages(E);
    } else {
        emit_phase(E, PHASE_FORWARD, -1, "run_forward", "The forward pass.");
        if (trains) {
            emit_phase(E, PHASE_BACKWARD, -1, "run_backward", "The backward pass: gradients of the loss into ctx->grads.");
            if (g->optimizer.kind != OPTIM_NONE)
                emit_phase(E, PHASE_UPDATE, -1, "run_update", "The optimizer update (ctx->step already counts it).");
        }
    }

    /* the public API */
    /* one allocation routine; the partitioned create joins the mesh first */
    if (E->partitioned) {
        cg_line(w, "%s_ctx *%s_create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {", m, m);
        w->indent++;
        cg_line(w, "if (dmrt_mesh_init(rank, %d, mesh_axis_names, mesh_axis_sizes, err, errlen) != 0) return NULL;", g->n_axes);
    } else {
        cg_line(w, "%s_ctx *%s_create(uint64_t seed) {", m, m);
        w->indent++;
    }
    cg_line(w, "struct_ctx *ctx = calloc(1, sizeof *ctx);");
    cg_line(w, "if (!ctx) goto oom;");
    cg_line(w, "ctx->params = dmrt_alloc(%lld * sizeof(float));", (long long)P->param_elems);
    cg_line(w, "ctx->grads = dmrt_alloc(%lld * sizeof(float));", (long long)P->grad_elems);
    cg_line(w, "ctx->state = dmrt_alloc(%lld * sizeof(float));", (long long)P->state_elems);
    if (E->scheduled) {
        cg_line(w, "ctx->arena = dmrt_alloc((size_t)stage_slots[%s] * %lld * sizeof(float));", E->pipe_axis >= 0 ? "dmrt_mesh_coord(rank, PIPELINE_AXIS)" : "0",
                (long long)P->arena_elems);
        if (trains && g->microbatches > 1) cg_line(w, "ctx->grad_sum = dmrt_alloc(%lld * sizeof(float));", (long long)P->grad_elems);
        for (int i = 0; i < g->n_outputs; i++)
            cg_line(w, "ctx->output_%s = dmrt_alloc(%lld * sizeof(%s));", E->cname[g->outputs[i]],
                    (long long)(g->microbatches * ir_numel(T(E, g->outputs[i]))), ctype(V(E, g->outputs[i])->type.dtype));
        char cond[512] = "";
        size_t n = 0;
        if (trains && g->microbatches > 1) n += (size_t)snprintf(cond + n, sizeof cond - n, " || !ctx->grad_sum");
        for (int i = 0; i < g->n_outputs && n < sizeof cond; i++)
            n += (size_t)snprintf(cond + n, sizeof cond - n, " || !ctx->output_%s", E->cname[g->outputs[i]]);
        if (n) cg_line(w, "if (%s) goto oom;", cond + 4);
    } else {
        cg_line(w, "ctx->arena = dmrt_alloc(%lld * sizeof(float));", (long long)P->arena_elems);
    }
    if (E->partitioned) {
        cg_line(w, "ctx->scratch = dmrt_alloc(%lld * sizeof(float));", (long long)E->scratch_elems);
        cg_line(w, "ctx->rank = rank;");
        cg_line(w, "for (int axis = 0; axis < %d; axis++) {", g->n_axes);
        cg_line(w, "    ctx->comm[axis] = dmrt_mesh_axis(rank, axis);");
        cg_line(w, "    ctx->coord[axis] = dmrt_mesh_coord(rank, axis);");
        cg_line(w, "}");
        cg_line(w, "if (!ctx->params || !ctx->grads || !ctx->state || !ctx->arena || !ctx->scratch) goto oom;");
    } else {
        cg_line(w, "if (!ctx->params || !ctx->grads || !ctx->state || !ctx->arena) goto oom;");
    }
    cg_line(w, "if (init_params(ctx, seed) != DMRT_OK) goto oom;");
    cg_line(w, "return ctx;");
    w->indent--;
    cg_line(w, "oom:");
    w->indent++;
    cg_line(w, "%s_destroy(ctx);", m);
    if (E->partitioned) cg_line(w, "snprintf(err, errlen, \"%s: out of memory\");", m);
    cg_line(w, "return NULL;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "void %s_destroy(%s_ctx *ctx) {", m, m);
    cg_line(w, "    if (!ctx) return;");
    if (E->partitioned) {
        /* a step that failed may have left gradient buckets reducing ctx->grads */
        cg_line(w, "    for (int axis = 0; axis < %d; axis++)", g->n_axes);
        cg_line(w, "        if (ctx->comm[axis]) (void)dmrt_comm_wait(ctx->comm[axis]);");
    }
    cg_line(w, "    dmrt_free(ctx->params);");
    cg_line(w, "    dmrt_free(ctx->grads);");
    cg_line(w, "    dmrt_free(ctx->state);");
    cg_line(w, "    dmrt_free(ctx->arena);");
    if (E->scheduled && trains && g->microbatches > 1) cg_line(w, "    dmrt_free(ctx->grad_sum);");
    for (int i = 0; E->scheduled && i < g->n_outputs; i++) cg_line(w, "    dmrt_free(ctx->output_%s);", E->cname[g->outputs[i]]);
    if (E->partitioned) cg_line(w, "    dmrt_free(ctx->scratch);");
    cg_line(w, "    free(ctx);");
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "int %s_load_weights(%s_ctx *ctx, const char *path) {", m, m);
    cg_line(w, "    ctx->error[0] = 0;");
    cg_line(w, "    return dmrt_load_params(&%s_model, ctx, path, ctx->error, sizeof ctx->error) ? DMRT_ERR_FILE : DMRT_OK;", m);
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "int %s_save_weights(%s_ctx *ctx, const char *path) {", m, m);
    cg_line(w, "    ctx->error[0] = 0;");
    cg_line(w, "    return dmrt_save_params(&%s_model, ctx, path, ctx->error, sizeof ctx->error) ? DMRT_ERR_FILE : DMRT_OK;", m);
    cg_line(w, "}");
    cg_blank(w);
    if (E->scheduled) emit_scheduled_api(E);
    else {
        const char *loss_name = has_loss ? E->cname[g->loss] : NULL;
        cg_line(w, "int %s_forward(%s_ctx *ctx, const %s_batch *batch, float *loss) {", m, m, m);
        w->indent++;
        cg_line(w, "ctx->error[0] = 0;");
        cg_line(w, "int status = run_forward(ctx, batch);");
        if (has_loss) {
            char where[128];
            storage_expr(E, g->loss, where, sizeof where);
            cg_line(w, "if (status == DMRT_OK && loss) *loss = *(%s); /* %s */", where, loss_name);
        } else {
            cg_line(w, "if (loss) *loss = 0.0f; /* the model declares no loss */");
        }
        cg_line(w, "return status;");
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
        if (open_train_step(E)) {
            cg_line(w, "int status = %s_forward(ctx, batch, loss);", m);
            cg_line(w, "if (status == DMRT_OK) status = run_backward(ctx, batch);");
            if (g->optimizer.kind != OPTIM_NONE) {
                cg_line(w, "if (status != DMRT_OK) return status;");
                cg_line(w, "ctx->step++;");
                cg_line(w, "return run_update(ctx, batch);");
            } else {
                cg_line(w, "return status; /* no optimizer: gradients only */");
            }
        }
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
        for (int i = 0; i < g->n_outputs; i++) {
            const ir_value *v = V(E, g->outputs[i]);
            char where[128];
            storage_expr(E, v->id, where, sizeof where);
            if (E->plan->region[v->id] == REGION_INPUT) snprintf(where, sizeof where, "NULL /* an input: the caller has it */");
            cg_line(w, "const %s *%s_output_%s(const %s_ctx *ctx) {", ctype(v->type.dtype), m, E->cname[v->id], m);
            if (E->plan->region[v->id] == REGION_INPUT) cg_line(w, "    (void)ctx;");
            cg_line(w, "    return %s%s;", v->type.dtype == DT_I32 && E->plan->region[v->id] != REGION_INPUT ? "(const int32_t *)" : "", where);
            cg_line(w, "}");
            cg_blank(w);
        }
    }
    cg_line(w, "const char *%s_error(const %s_ctx *ctx) { return ctx->error; }", m, m);
    cg_blank(w);

    /* the descriptor */
    if (E->partitioned) {
        cg_line(w, "static void *model_create_rank(uint64_t seed, dmrt_rank *rank, char *err, size_t errlen) {");
        cg_line(w, "    return %s_create_rank(seed, rank, err, errlen);", m);
        cg_line(w, "}");
        cg_line(w, "static int model_gather(void *ctx, int i, int grad, float *whole) { return gather_param(ctx, i, grad, whole); }");
        cg_line(w, "static void model_scatter(void *ctx, int i, const float *whole) { scatter_param(ctx, i, whole); }");
        cg_line(w, "static int model_rank_id(void *ctx) { return dmrt_rank_id(((struct_ctx *)ctx)->rank); }");
    } else {
        cg_line(w, "static void *model_create(uint64_t seed, char *err, size_t errlen) {");
        cg_line(w, "    struct_ctx *ctx = %s_create(seed);", m);
        cg_line(w, "    if (!ctx) snprintf(err, errlen, \"%s: out of memory\");", m);
        cg_line(w, "    return ctx;");
        cg_line(w, "}");
    }
    cg_line(w, "static void model_destroy(void *ctx) { %s_destroy(ctx); }", m);
    cg_line(w, "static void *model_param(void *ctx, int i) { return ((struct_ctx *)ctx)->params + param_offsets[i]; }");
    if (trains)
        cg_line(w, "static void *model_grad(void *ctx, int i) { return ((struct_ctx *)ctx)->grads + grad_offsets[i]; }");
    else
        cg_line(w, "static void *model_grad(void *ctx, int i) { (void)ctx; (void)i; return NULL; }");
    cg_line(w, "static %s_batch batch_of(const void *const *inputs) {", m);
    cg_line(w, "    %s_batch batch;", m);
    cg_line(w, "    memset(&batch, 0, sizeof batch);");
    if (!g->n_inputs) cg_line(w, "    (void)inputs;");
    for (int i = 0; i < g->n_inputs; i++) cg_line(w, "    batch.%s = inputs[%d];", E->cname[g->inputs[i]], i);
    cg_line(w, "    return batch;");
    cg_line(w, "}");
    cg_line(w, "static int model_forward(void *ctx, const void *const *inputs, float *loss) {");
    cg_line(w, "    %s_batch batch = batch_of(inputs);", m);
    cg_line(w, "    return %s_forward(ctx, &batch, loss);", m);
    cg_line(w, "}");
    cg_line(w, "static int model_train_step(void *ctx, const void *const *inputs, float *loss) {");
    cg_line(w, "    %s_batch batch = batch_of(inputs);", m);
    cg_line(w, "    return %s_train_step(ctx, &batch, loss);", m);
    cg_line(w, "}");
    cg_line(w, "static const void *model_output(void *ctx, int i) {");
    if (!g->n_outputs) cg_line(w, "    (void)ctx;");
    cg_line(w, "    switch (i) {");
    for (int i = 0; i < g->n_outputs; i++) cg_line(w, "    case %d: return %s_output_%s(ctx);", i, m, E->cname[g->outputs[i]]);
    cg_line(w, "    default: return NULL;");
    cg_line(w, "    }");
    cg_line(w, "}");
    cg_line(w, "static const char *model_error(void *ctx) { return %s_error(ctx); }", m);
    cg_blank(w);
    cg_line(w, "const dmrt_model %s_model = {", m);
    cg_line(w, "    .name = \"%s\",", m);
    cg_line(w, "    .n_inputs = %d,", g->n_inputs);
    cg_line(w, "    .inputs = input_descs,");
    cg_line(w, "    .n_params = %d,", g->n_params);
    cg_line(w, "    .params = param_descs,");
    cg_line(w, "    .n_outputs = %d,", g->n_outputs);
    cg_line(w, "    .outputs = output_descs,");
    if (E->partitioned) {
        cg_line(w, "    .n_ranks = %lld,", (long long)ir_mesh_ranks(g));
        cg_line(w, "    .n_mesh_axes = %d,", g->n_axes);
        cg_line(w, "    .mesh_axis_names = mesh_axis_names,");
        cg_line(w, "    .mesh_axis_sizes = mesh_axis_sizes,");
        cg_line(w, "    .create_rank = model_create_rank,");
        cg_line(w, "    .gather = model_gather,");
        cg_line(w, "    .scatter = model_scatter,");
        cg_line(w, "    .rank_id = model_rank_id,");
    } else {
        cg_line(w, "    .n_ranks = 1,");
        cg_line(w, "    .create = model_create,");
    }
    cg_line(w, "    .destroy = model_destroy,");
    cg_line(w, "    .param = model_param,");
    cg_line(w, "    .grad = model_grad,");
    cg_line(w, "    .forward = model_forward,");
    cg_line(w, "    .train_step = model_train_step,");
    cg_line(w, "    .output = model_output,");
    cg_line(w, "    .error = model_error,");
    cg_line(w, "};");
}

/* What pipelined code generation does not handle yet. */
static int check_stages(const emitter *E, FILE *err) {
    const ir_graph *g = E->g;
    int bad = 0;
    if (E->stages > 64) {
        fprintf(err, "%s: error: at most 64 pipeline stages, the mesh has %d\n", E->source_path, E->stages);
        return -1;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        if (g->microbatches > 1 && (v->type.rank == 0 || !v->type.dim_name[0] || strcmp(v->type.dim_name[0], g->batch_dim) != 0)) {
            fprintf(err, "%s:%d: error: output '%s' does not lead with the batch '%s': with micro-batches, outputs are "
                         "the step's rows\n", E->source_path, v->loc.line, v->name, g->batch_dim);
            bad = -1;
        }
        if (E->plan->region[v->id] != REGION_ARENA) {
            fprintf(err, "%s:%d: error: output '%s' is not computed: with micro-batches or stages, outputs are results of ops\n",
                    E->source_path, v->loc.line, v->name);
            bad = -1;
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->op == OP_PARAM && E->needed_on[i] & ~((uint64_t)1 << v->stage)) {
            fprintf(err, "%s:%d: error: parameter '%s' is used on more than one pipeline stage (tied weights): not "
                         "supported yet\n", E->source_path, v->loc.line, v->name);
            bad = -1;
        }
        uint64_t others = E->needed_on[i] & ~((uint64_t)1 << v->stage);
        if (E->plan->region[i] != REGION_ARENA || !others) continue;
        /* forward values flow to later stages, gradients to earlier ones, updates nowhere */
        uint64_t earlier = ((uint64_t)1 << v->stage) - 1;
        if (v->phase == PHASE_UPDATE || (others & (v->phase == PHASE_FORWARD ? earlier : ~earlier))) {
            fprintf(err, "%s:%d: error: internal: '%s' (stage %d) is read by a stage the schedule runs before it\n",
                    E->source_path, v->loc.line, v->name ? v->name : "?", v->stage);
            bad = -1;
        }
    }
    return bad;
}

/* What SPMD code generation does not handle yet, refused before anything is written. */
static int check_spmd(const emitter *E, FILE *err) {
    const ir_graph *g = E->g;
    int bad = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_type *t = &V(E, g->inputs[i])->type;
        for (int d = 0; d < t->rank; d++) {
            if (t->split[d] == IR_REPLICATED) continue;
            if (dims_product(t, 0, d) != 1) {
                fprintf(err, "%s:%d: error: input '%s' is split on dim %d over '%s': generated code reads a rank's block of "
                             "an input only when the split dim is the leading one\n",
                        E->source_path, V(E, g->inputs[i])->loc.line, V(E, g->inputs[i])->name, d,
                        g->axes[t->split[d]].name);
                bad = -1;
            }
            break;
        }
    }
    if (E->scheduled && check_stages(E, err)) bad = -1;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->op == OP_ALLTOALL && v->type.rank + 1 > IR_MAX_RANK) {
            fprintf(err, "%s:%d: error: an all-to-all of a rank-%d tensor is not supported (at most %d dims)\n",
                    E->source_path, v->loc.line, v->type.rank, IR_MAX_RANK - 1);
            bad = -1;
        }
    }
    return bad;
}

/* Writes via a temporary file and rename, so a failed run leaves no half-written file. */
static int write_file(emitter *E, const char *dir, const char *name, void (*body)(emitter *), FILE *err) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fprintf(err, "dmc: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    E->w = (cg_writer){.f = f};
    body(E);
    int failed = ferror(f);
    if (fclose(f) != 0) failed = 1;
    if (failed || rename(tmp, path) != 0) {
        fprintf(err, "dmc: error: cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

int codegen_c(const ir_graph *g, const dm_memory_plan *plan, const char *source_path, const char *source_text,
              size_t source_len, const codegen_options *options, const char *out_dir, FILE *err) {
    const char *base = strrchr(source_path, '/');
    emitter E = {.g = g, .plan = plan, .dialect = &cg_dialect_c, .source_path = base ? base + 1 : source_path,
                 .source_text = source_text, .source_len = source_len, .bucket_floats = GRAD_BUCKET_FLOATS};
    if (options && options->bucket_bytes > 0) E.bucket_floats = options->bucket_bytes / 4 > 0 ? options->bucket_bytes / 4 : 1;
    size_t n = 0;
    for (const char *p = g->model; *p && n + 1 < sizeof E.prefix_upper; p++) E.prefix_upper[n++] = (char)toupper((unsigned char)*p);
    E.prefix_upper[n] = 0;
    E.line_start = malloc((source_len + 2) * sizeof(size_t));
    if (!E.line_start) abort();
    E.line_start[E.n_lines++] = 0;
    for (size_t i = 0; i < source_len; i++)
        if (source_text[i] == '\n') E.line_start[E.n_lines++] = i + 1;
    assign_names(&E);
    E.local = malloc(((size_t)g->n_values + 1) * sizeof *E.local);
    if (!E.local) abort();
    for (int i = 0; i < g->n_values; i++) {
        ir_type *t = &E.local[i];
        *t = g->values[i]->type;
        for (int d = 0; d < t->rank; d++)
            if (t->split[d] != IR_REPLICATED) {
                t->shape[d] /= g->axes[t->split[d]].size;
                E.partitioned = 1;
            }
        if (t->partial) E.partitioned = 1;
    }
    E.arena_var = "ctx->arena";
    E.pipe_axis = g->pipe_axis >= 0 && g->axes[g->pipe_axis].size > 1 ? g->pipe_axis : -1;
    E.stages = E.pipe_axis >= 0 ? (int)g->axes[E.pipe_axis].size : 1;
    E.scheduled = E.stages > 1 || g->microbatches > 1;
    if (E.pipe_axis >= 0) E.partitioned = 1;
    if (E.scheduled) plan_stages(&E);
    E.scratch_elems = scratch_need(&E);
    plan_buckets(&E);
    if (E.scheduled)
        for (int i = 0; i < g->n_values; i++) E.bucket_ready[i] = -1; /* reduced after the last micro-batch */
    int status = check_spmd(&E, err);
    char h[300], c[300];
    snprintf(h, sizeof h, "%s.h", g->model);
    snprintf(c, sizeof c, "%s.c", g->model);
    if (!status) status = write_file(&E, out_dir, h, emit_header, err);
    if (!status) status = write_file(&E, out_dir, c, emit_source, err);
    free(E.local);
    free(E.bucket_lead);
    free(E.bucket_ready);
    free(E.slots);
    if (E.scheduled) pipe_schedule_free(&E.sched);
    free(E.needed_on);
    for (int i = 0; i < g->n_values; i++) free(E.cname[i]);
    free(E.cname);
    free(E.line_start);
    return status;
}
