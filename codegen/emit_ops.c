/* emit_ops.c: each op of the step as a kernel description handed to the dialect: loop
 * nests (elementwise, reductions, broadcasts, transposes, slices), products, row-wise
 * kernels, embeddings, losses, optimizer updates; and the collectives the shard pass
 * inserted, with the gradient buckets of passes/buckets.c. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

typedef struct literal {
    char text[64];
} literal;

/* Operand k of a loop nest: its buffer, or its value inline when it is a constant. */
/* A constant's text: its literal, or for the loss's gradient seed under loss scaling the
 * scale (emit_clip.c unscales the gradients before the update). */
static void const_text(const emitter *E, int id, char *text, size_t size) {
    if (V(E, id)->loss_seed && E->g->loss_scale > 0) snprintf(text, size, "(float)ctx->loss_scale.scale");
    else cg_float_literal(V(E, id)->scalar, text, size);
}

static void set_operand(const emitter *E, cg_loop_nest *k, int slot, const char *var, int id, literal *lit) {
    k->var[slot] = var;
    if (V(E, id)->op == OP_CONST) {
        const_text(E, id, lit->text, sizeof lit->text);
        k->constant[slot] = lit->text;
    } else {
        k->buffer[slot] = E->cname[id];
    }
}

static void emit_product(emitter *E, const ir_value *v, const ir_value *bias_grad);

/* The activation u of a bias's add that it completes (passes/fuse_bias.c), or -1. */
static int bias_of_activation(const emitter *E, int u) {
    const ir_value *v = V(E, u);
    return v->n_operands == 1 && E->activation_of_bias[v->operands[0]] == u ? v->operands[0] : -1;
}

/* expr with every identifier `from` spelled `to` (numbers such as 1.0f left whole). */
static void rename_var(const char *expr, const char *from, const char *to, char *out, size_t size) {
    size_t n = 0, from_len = strlen(from);
    for (const char *p = expr; *p && n + 1 < size;) {
        if (isalpha((unsigned char)*p) || *p == '_' || isdigit((unsigned char)*p)) {
            const char *q = p;
            while (isalnum((unsigned char)*q) || *q == '_' || (isdigit((unsigned char)*p) && *q == '.')) q++;
            int match = !isdigit((unsigned char)*p) && (size_t)(q - p) == from_len && strncmp(p, from, from_len) == 0;
            n += (size_t)snprintf(out + n, size - n, "%.*s", match ? (int)strlen(to) : (int)(q - p), match ? to : p);
            p = q;
        } else {
            out[n++] = *p++;
        }
    }
    out[n < size ? n : size - 1] = 0;
}

/* The cast v's loop also stores (emit_fused_cast.c), into k; out_unread set where it
 * stores that copy alone (cg_stores_copy_alone; NULL for a layernorm gradient's rows). */
static void store_cast_too(emitter *E, const ir_value *v, const char **cast_out, ir_dtype *cast_dtype, int *out_unread) {
    int c = fused_cast_of(E, v);
    if (c < 0) return;
    *cast_out = E->cname[c];
    *cast_dtype = T(E, c)->dtype;
    int unread = out_unread && cg_stores_copy_alone(E, v);
    if (unread) *out_unread = 1;
    cg_line(&E->w, "/* and its %s copy %s, in the same pass%s */", ir_dtype_name(*cast_dtype), E->cname[c],
            unread ? " (nothing else reads its f32 value)" : "");
}

/* Whether v's kernel is one that passes out_unread to the dialect (store_cast_too's
 * callers). */
static int kernel_may_store_copy_alone(const emitter *E, const ir_value *v) {
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_BINARY: return v->op != OP_DROPOUT && residual_norm_of(E, v) < 0 && !runs_product(E, v);
    case OPC_TRANSPOSE: return 1;
    case OPC_SLICE: return v->op == OP_SLICE && !v->slice_view;
    case OPC_NORM: return v->op == OP_LAYERNORM && v->type.shape[v->type.rank - 1] <= CG_LOCAL_ROW_MAX;
    default: return 0;
    }
}

void cg_index_readers(emitter *E) {
    const ir_graph *g = E->g;
    int *at = calloc((size_t)g->n_values + 2, sizeof(int));
    if (!at) abort();
    for (int i = 0; i < g->n_values; i++)
        for (int k = 0; k < V(E, i)->n_operands; k++) at[V(E, i)->operands[k] + 2]++;
    for (int x = 0; x < g->n_values; x++) at[x + 2] += at[x + 1];
    int *ids = malloc(((size_t)at[g->n_values + 1] + 1) * sizeof(int));
    int *reads = calloc((size_t)g->n_values + 1, sizeof(int));
    if (!ids || !reads) abort();
    /* at[x + 1] is where x's next reader goes; after the fill, at[x] is where x's first is */
    for (int i = 0; i < g->n_values; i++)
        for (int k = 0; k < V(E, i)->n_operands; k++) {
            ids[at[V(E, i)->operands[k] + 1]++] = i;
            if (ir_reads_operand(V(E, i), k)) reads[V(E, i)->operands[k]]++;
        }
    E->reader_at = at;
    E->reader_ids = ids;
    E->reads = reads;
}

int cg_next_reader(const emitter *E, int x, int after, ir_op op, int slot) {
    for (int r = E->reader_at[x]; r < E->reader_at[x + 1]; r++) {
        const ir_value *u = V(E, E->reader_ids[r]);
        if (u->id > after && u->op == op && slot < u->n_operands && u->operands[slot] == x) return u->id;
    }
    return -1;
}

int cg_last_reader(const emitter *E, int x, int before, ir_op op, int slot) {
    for (int r = E->reader_at[x + 1] - 1; r >= E->reader_at[x]; r--) {
        const ir_value *u = V(E, E->reader_ids[r]);
        if (u->id < before && u->op == op && slot < u->n_operands && u->operands[slot] == x) return u->id;
    }
    return -1;
}

void cg_mark_copy_alone(emitter *E) {
    const ir_graph *g = E->g;
    E->copy_alone = calloc((size_t)g->n_values + 1, 1);
    if (!E->copy_alone) abort();
    for (int i = 0; E->dialect->can.copy_alone && i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        int c = fused_cast_of(E, v);
        E->copy_alone[i] = c >= 0 && cg_cast_only_reader(E, v, c) && kernel_may_store_copy_alone(E, v);
    }
}

/* The sum product + bias (a local, pre_activation), stored back as the add's value, then
 * the activation of it. */
static void emit_bias_activation(emitter *E, const ir_value *u, int add) {
    const ir_value *a = V(E, add);
    const ir_type *t = T(E, add);
    int64_t n = t->shape[t->rank - 1];
    char activation[1024], expr[2048];
    rename_var(ir_op_info_of(u->op)->forward, "x", "pre_activation", activation, sizeof activation);
    /* not "p": the CUDA dialect's kernels count their threads' positions in p */
    snprintf(expr, sizeof expr, "pre_activation = product + bias; %s", activation);
    cg_loop_nest k = {.rank = 2, .size = {ir_numel(t) / n, n}, .n_in = 2, .out = E->cname[u->id], .out_stride = {n, 1},
                      .out_elems = ir_numel(t), .expr = expr, .also_out = E->cname[add]};
    literal lits[2];
    set_operand(E, &k, 0, "product", add, &lits[0]);
    k.stride[0][0] = n, k.stride[0][1] = 1;
    set_operand(E, &k, 1, "bias", a->operands[1], &lits[1]);
    k.stride[1][1] = 1;
    cg_line(&E->w, "/* %s = %s + its bias %s, stored, and %s of it, in one pass */", E->cname[add],
            E->cname[a->operands[0]], E->cname[a->operands[1]], ir_op_info_of(u->op)->name);
    store_cast_too(E, u, &k.cast_out, &k.cast_dtype, &k.out_unread);
    cg_coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

static void emit_rowwise_into(emitter *E, const ir_value *v, const ir_value *sum_add);

static void emit_elementwise(emitter *E, const ir_value *v) {
    int add = bias_of_activation(E, v->id);
    if (add >= 0) {
        emit_bias_activation(E, v, add);
        return;
    }
    int norm = residual_norm_of(E, v);
    if (norm >= 0) {
        cg_line(&E->w, "/* made by %s's pass, below */", E->cname[norm]);
        return;
    }
    if (runs_product(E, v)) {
        int product = dm_product_run_by(E->plan, v), sum = dm_sum_added_to(E->plan, v);
        cg_line(&E->w, "/* %s shares the buffer of %s */", E->cname[v->id], E->cname[sum >= 0 ? sum : product]);
        if (V(E, product)->op == OP_LAYERNORM_GRAD) {
            cg_line(&E->w, "/* the gradient %s, added to %s in its buffer: the sum */", E->cname[product], E->cname[sum]);
            emit_rowwise_into(E, V(E, product), v);
        } else {
            emit_product(E, V(E, product), NULL);
        }
        return;
    }
    if (E->plan->assembled_in[v->id] >= 0) {
        cg_line(&E->w, "/* %s = %s + %s: their windows of %s, filled above */", E->cname[v->id], E->cname[v->operands[0]],
                E->cname[v->operands[1]], E->cname[E->plan->assembled_in[v->id]]);
        return;
    }
    if (E->in_micro && add_made_by_operands(E, v)) {
        cg_line(&E->w, "/* %s = %s + %s: both made in the step's sum over the micro-batches, above */", E->cname[v->id],
                E->cname[v->operands[0]], E->cname[v->operands[1]]);
        return;
    }
    const ir_op_info *info = ir_op_info_of(v->op);
    cg_loop_nest k = {0};
    literal lits[CG_MAX_OPERANDS];
    k.rank = T(E, v->id)->rank;
    for (int d = 0; d < k.rank; d++) k.size[d] = T(E, v->id)->shape[d];
    cg_contiguous_strides(T(E, v->id), k.out_stride);
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    static const char *const unary_vars[] = {"x", "y", "dy"};
    static const char *const binary_vars[] = {"a", "b"};
    if (info->cls == OPC_UNARY || info->cls == OPC_UNARY_GRAD) {
        k.expr = info->cls == OPC_UNARY ? info->forward : ir_op_info_of(v->unary)->backward;
        k.n_in = v->n_operands;
        for (int i = 0; i < k.n_in; i++) {
            set_operand(E, &k, i, unary_vars[i], v->operands[i], &lits[i]);
            cg_contiguous_strides(T(E, v->id), k.stride[i]);
        }
    } else {
        k.expr = info->forward;
        k.n_in = 2;
        for (int i = 0; i < 2; i++) {
            const ir_type *t = T(E, v->operands[i]);
            int64_t own[IR_MAX_RANK];
            cg_contiguous_strides(t, own);
            for (int d = 0; d < k.rank; d++) {
                int td = d - (k.rank - t->rank);
                k.stride[i][d] = td < 0 || t->shape[td] == 1 ? 0 : own[td];
            }
            set_operand(E, &k, i, binary_vars[i], v->operands[i], &lits[i]);
        }
    }
    store_cast_too(E, v, &k.cast_out, &k.cast_dtype, &k.out_unread);
    cg_coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* A cast to bf16 or f16 (passes/precision.c): each element rounded, as the dialect spells it. */
static void emit_cast(emitter *E, const ir_value *v) {
    if (cast_made_by_producer(E, v)) {
        cg_line(&E->w, "/* stored by the loop that wrote %s, above */", E->cname[v->operands[0]]);
        return;
    }
    int sum = cast_summed_with(E, v);
    if (sum >= 0) {
        cg_line(&E->w, "/* stored by the loop that sums %s into %s, below */", E->cname[v->operands[0]], E->cname[sum]);
        return;
    }
    cg_loop_nest k = {.rank = 1, .size = {ir_numel(T(E, v->id))}, .n_in = 1, .out = E->cname[v->id],
                      .out_stride = {1}, .out_elems = ir_numel(T(E, v->id)), .expr = E->dialect->round_to[T(E, v->id)->dtype]};
    literal lit;
    k.stride[0][0] = 1;
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    E->dialect->loop_nest(&E->w, &k);
}

/* The bias's gradient that layernorm weight gradient v sums in its own pass
 * (can.wgrad_bias): the next sum_to of v's dy, over its rows, in the same function, that
 * may be written at v's place (cg_may_make_early: a gradient's buffer, or a data-parallel
 * rank's partial gradient apart from every buffer in use in between); or -1. */
static int wgrad_bias_of(const emitter *E, const ir_value *v) {
    const ir_graph *g = E->g;
    if (v->op != OP_LAYERNORM_WGRAD || !E->dialect->can.wgrad_bias || E->plan->stages > 1 || g->microbatches > 1 ||
        g->zero)
        return -1;
    const ir_type *w = T(E, v->id);
    int i = cg_next_reader(E, v->operands[1], v->id, OP_SUM_TO, 0);
    if (i < 0) return -1;
    const ir_value *s = V(E, i);
    const ir_type *t = T(E, i);
    if (s->phase != v->phase || s->stage != v->stage || s->segment != v->segment || !cg_may_make_early(E, v->id, i) ||
        t->rank != 1 || w->rank != 1 || t->shape[0] != w->shape[0] || t->dtype != DT_F32 ||
        (E->summed && E->summed[i] >= 0))
        return -1;
    return i;
}

/* The layernorm weight gradient that sums sum_to v (wgrad_bias_of), or -1. */
static int wgrad_summing(const emitter *E, const ir_value *v) {
    if (v->op != OP_SUM_TO) return -1;
    int w = cg_last_reader(E, v->operands[0], v->id, OP_LAYERNORM_WGRAD, 1);
    return w >= 0 && wgrad_bias_of(E, V(E, w)) == v->id ? w : -1;
}

int sum_made_elsewhere(const emitter *E, const ir_value *v) {
    return wgrad_summing(E, v) >= 0 || product_summing_bias(E, v) >= 0;
}

/* sum, mean, sum_to (big → small) and broadcast (small → big): the small tensor's
 * layout is the big one's with the dims in v->axes left out. */
static void emit_reduce_or_broadcast(emitter *E, const ir_value *v) {
    int wgrad = wgrad_summing(E, v), product = wgrad < 0 ? product_summing_bias(E, v) : -1;
    if (wgrad >= 0) {
        cg_line(&E->w, "/* summed by the loop that made %s, above */", E->cname[wgrad]);
        return;
    }
    if (product >= 0) {
        emit_product(E, V(E, product), v);
        return;
    }
    int is_broadcast = v->op == OP_BROADCAST;
    const ir_type *big = is_broadcast ? T(E, v->id) : T(E, v->operands[0]);
    cg_loop_nest k = {0};
    literal lit, scale;
    k.rank = big->rank;
    int64_t big_stride[IR_MAX_RANK], small_stride[IR_MAX_RANK], s = 1;
    cg_contiguous_strides(big, big_stride);
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
    int cast = cast_stored_by_sum(E, v);
    if (cast >= 0) {
        k.operand_cast_out = E->cname[cast];
        k.cast_dtype = T(E, cast)->dtype;
        cg_line(&E->w, "/* and %s's %s copy %s, in the same pass */", E->cname[v->operands[0]],
                ir_dtype_name(k.cast_dtype), E->cname[cast]);
    }
    cg_coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

static void emit_transpose(emitter *E, const ir_value *v) {
    const ir_type *in = T(E, v->operands[0]);
    cg_loop_nest k = {0};
    literal lit;
    int64_t in_stride[IR_MAX_RANK];
    cg_contiguous_strides(in, in_stride);
    k.rank = T(E, v->id)->rank;
    for (int d = 0; d < k.rank; d++) {
        k.size[d] = T(E, v->id)->shape[d];
        k.stride[0][d] = in_stride[v->perm[d]];
    }
    cg_contiguous_strides(T(E, v->id), k.out_stride);
    k.n_in = 1;
    k.out = E->cname[v->id];
    k.out_elems = ir_numel(T(E, v->id));
    k.expr = "x";
    set_operand(E, &k, 0, "x", v->operands[0], &lit);
    store_cast_too(E, v, &k.cast_out, &k.cast_dtype, &k.out_unread);
    cg_coalesce(&k);
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

/* The product v into its buffer, filled first with the bias of its add when it has one
 * (pass_memory's bias_add_of: the product adds to it, beta 1); bias_grad: the sum_to whose
 * rows it also sums (emit_bias_grad.c), or NULL. */
static void emit_product(emitter *E, const ir_value *v, const ir_value *bias_grad) {
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
    /* a parameter's window read where it lies has its rows further apart (slice_views.c) */
    k.lda = v->batch_dims > 0 ? a_cols : ir_rows_apart(E->g, v->operands[0]);
    k.ldb = v->batch_dims > 0 ? b_cols : ir_rows_apart(E->g, v->operands[1]);
    if (v->trans_a) {
        k.m = a_cols, k.k = a_rows;
        k.n = v->trans_b ? b_rows : b_cols;
    } else {
        k.m = a_rows, k.k = a_cols, k.n = v->trans_b ? b_rows : b_cols;
    }
    k.ldc = E->plan->row_stride[v->id] ? E->plan->row_stride[v->id] : k.n; /* its window's rows (memory_windows.c) */
    k.operands = a->dtype;
    int add = E->plan->bias_add_of[v->id], sum_add = E->plan->sum_add_of[v->id];
    if (bias_grad) {
        k.bias_grad = E->cname[bias_grad->id];
        cg_line(&E->w, "/* %s, made here for the sum %s of %s's rows, which it also makes (its k runs over them) */",
                E->cname[v->id], k.bias_grad, k.b);
    }
    if (E->in_micro && made_in_sum(E, v->id) && !cg_sum_adds_if(E, v->id)) {
        cg_line(&E->w, "/* %s, added to the step's sum over the micro-batches (beta 1), which %s made first */",
                E->cname[v->id], E->cname[V(E, E->plan->storage_of[v->id])->operands[0] == v->id
                                              ? V(E, E->plan->storage_of[v->id])->operands[1]
                                              : V(E, E->plan->storage_of[v->id])->operands[0]]);
        k.accumulate = 1;
    } else if (E->in_micro && made_in_sum(E, v->id)) {
        cg_line(&E->w, "/* %s, made in %sthe step's sum over the micro-batches: beta 0 for the first, 1 after */",
                E->cname[v->id], E->plan->storage_of[v->id] == v->id || add_made_by_operands(E, V(E, E->plan->storage_of[v->id]))
                                     ? "" : "its window of ");
        k.beta = "micro > 0 ? 1.0f : 0.0f";
    } else if (sum_add >= 0) {
        cg_line(&E->w, "/* the product %s, added to %s in its buffer (beta 1): the sum */", E->cname[v->id],
                E->cname[dm_sum_added_to(E->plan, V(E, sum_add))]);
        k.accumulate = 1;
    } else if (add >= 0 && E->activation_of_bias[add] >= 0) {
        cg_line(&E->w, "/* the product %s; its bias %s is added by %s's pass, below */", E->cname[v->id],
                E->cname[V(E, add)->operands[1]], E->cname[E->activation_of_bias[add]]);
    } else if (add >= 0 && E->dialect->can.gemm_bias && k.batch == 1 && k.operands != DT_F16 &&
               V(E, V(E, add)->operands[1])->op != OP_CONST && !is_quant_product(E, v)) {
        k.bias = E->cname[V(E, add)->operands[1]];
        cg_line(&E->w, "/* the product %s with its bias %s, added in the same call: the sum */", E->cname[v->id], k.bias);
    } else if (add >= 0) {
        const ir_type *t = T(E, v->id);
        int64_t n = t->shape[t->rank - 1];
        cg_loop_nest fill = {.rank = 2, .size = {ir_numel(t) / n, n}, .n_in = 1, .out = E->cname[v->id],
                             .out_stride = {n, 1}, .out_elems = ir_numel(t), .expr = "b"};
        literal lit;
        fill.stride[0][1] = 1;
        set_operand(E, &fill, 0, "b", V(E, add)->operands[1], &lit);
        cg_line(&E->w, "/* the product %s, into the bias %s: the sum */", E->cname[v->id], E->cname[V(E, add)->operands[1]]);
        cg_coalesce(&fill);
        E->dialect->loop_nest(&E->w, &fill);
        k.accumulate = 1;
    }
    if (!emit_quant_product(E, v, &k)) E->dialect->gemm(&E->w, &k);
}

/* A product with a bias's add or a sum's runs where the add is (its bias may be made later). */
static void emit_matmul(emitter *E, const ir_value *v) {
    int add = E->plan->bias_add_of[v->id], sum_add = E->plan->sum_add_of[v->id];
    int bias_grad = bias_summed_by_product(E, v);
    if (add >= 0) cg_line(&E->w, "/* computed with its bias by %s, below */", E->cname[add]);
    else if (sum_add >= 0) cg_line(&E->w, "/* computed into the sum by %s, below */", E->cname[sum_add]);
    else if (bias_grad >= 0) cg_line(&E->w, "/* computed with the sum %s, above */", E->cname[bias_grad]);
    else emit_product(E, v, NULL);
}

/* slice copies a window of one dim; pad writes its operand into that window of zeros,
 * or, in a window assembly, into its window of the sum's buffer (the others' pieces fill
 * the rest), where its piece may already have been made. */
static void emit_slice(emitter *E, const ir_value *v) {
    int pad = v->op == OP_PAD, assembled = pad && E->plan->assembled_in[v->id] >= 0;
    if (v->op == OP_SLICE && v->slice_view) {
        if (v->slice_rows_apart)
            cg_line(&E->w, "/* %s is read in place: its window of %s, rows %lld apart (its products' lda or ldb) */",
                    E->cname[v->id], E->cname[v->operands[0]], (long long)v->slice_rows_apart);
        else
            cg_line(&E->w, "/* %s is read in place: its window of %s */", E->cname[v->id], E->cname[v->operands[0]]);
        return;
    }
    if (assembled && dm_piece_in_place(E->plan, v)) {
        cg_line(&E->w, "/* %s: %s, made in its window of %s */", E->cname[v->id], E->cname[v->operands[0]],
                E->cname[E->plan->assembled_in[v->id]]);
        return;
    }
    if (assembled)
        cg_line(&E->w, "/* %s: %s copied into its window of %s */", E->cname[v->id], E->cname[v->operands[0]],
                E->cname[E->plan->assembled_in[v->id]]);
    const ir_type *small = pad ? T(E, v->operands[0]) : T(E, v->id);
    const ir_type *big = pad ? T(E, v->id) : T(E, v->operands[0]);
    int64_t small_stride[IR_MAX_RANK], big_stride[IR_MAX_RANK];
    cg_contiguous_strides(small, small_stride);
    cg_contiguous_strides(big, big_stride);
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
        k.accumulate = !assembled; /* zeros first, then the window */
    } else {
        k.offset[0] = window;
        store_cast_too(E, v, &k.cast_out, &k.cast_dtype, &k.out_unread);
    }
    cg_coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

/* Softmax, its gradient, the causal mask and layernorm: the operand viewed as (outer,
 * n, inner) around the dim the op works along. sum_add: the add that runs layernorm
 * gradient v into its sum (sum_add_of; v then accumulates, and stores the add's 16-bit
 * copy), or NULL. */
static void emit_rowwise_into(emitter *E, const ir_value *v, const ir_value *sum_add) {
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
    /* a layernorm's rows may be made in a local array where only the cast reads them; its
     * gradient's, which may add into a residual's, are stored */
    if (v->op == OP_LAYERNORM || v->op == OP_LAYERNORM_GRAD)
        store_cast_too(E, sum_add ? sum_add : v, &k.cast_out, &k.cast_dtype,
                       v->op == OP_LAYERNORM && !sum_add ? &k.out_unread : NULL);
    if (v->op == OP_LAYERNORM) {
        k.weight = operand[1], k.bias = operand[2];
        int sum = residual_made_by_norm(E, v);
        if (sum >= 0) {
            k.sum_a = E->cname[V(E, sum)->operands[0]], k.sum_b = E->cname[V(E, sum)->operands[1]];
            cg_line(&E->w, "/* and %s = %s + %s first, row by row, stored */", operand[0], k.sum_a, k.sum_b);
        }
        E->dialect->layernorm(&E->w, &k);
    } else if (v->op == OP_LAYERNORM_GRAD) {
        k.weight = operand[1], k.dy = operand[2];
        k.accumulate = sum_add != NULL;
        E->dialect->layernorm_grad(&E->w, &k);
    } else {
        k.dy = operand[1];
        int bias = wgrad_bias_of(E, v);
        if (bias >= 0) {
            k.bias_grad_out = E->cname[bias];
            cg_line(&E->w, "/* and the bias's gradient %s, the sum of %s over its rows, in the same pass */",
                    E->cname[bias], operand[1]);
        }
        if (E->dialect->wgrad_scratch_floats(k.outer * k.inner, k.n) > 0) k.scratch = "ctx->scratch";
        E->dialect->layernorm_wgrad(&E->w, &k);
    }
}

static void emit_rowwise(emitter *E, const ir_value *v) {
    int sum_add = E->plan->sum_add_of[v->id];
    if (sum_add >= 0) cg_line(&E->w, "/* computed into the sum by %s, below */", E->cname[sum_add]);
    else emit_rowwise_into(E, v, NULL);
}

static void emit_embed(emitter *E, const ir_value *v) {
    int grad = v->op == OP_EMBED_GRAD;
    const ir_type *table = grad ? T(E, v->id) : T(E, v->operands[0]);
    const ir_type *ids = T(E, v->operands[grad ? 0 : 1]);
    char position_base[256];
    cg_fault_position_base(E, v->operands[grad ? 0 : 1], position_base, sizeof position_base);
    cg_embed k = {.rows = ir_numel(ids), .n = table->shape[0], .cols = table->shape[1], .out = E->cname[v->id],
                  .ids = E->cname[v->operands[grad ? 0 : 1]], .fault_site = E->fault_site[v->id],
                  .position_base = position_base};
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
        if (E->dialect->embed_grad_scratch_bytes(k.rows) > 0) k.scratch = "ctx->scratch";
        if (E->in_micro && made_in_sum(E, v->id) && !cg_sum_adds_if(E, v->id)) {
            cg_line(&E->w, "/* %s, added to the step's sum over the micro-batches, which was written before it */",
                    E->cname[v->id]);
            k.accumulate = 1;
        } else if (E->in_micro && made_in_sum(E, v->id)) {
            cg_line(&E->w, "/* %s, made in the step's sum over the micro-batches: zeroed for the first, added to after */",
                    E->cname[v->id]);
            k.accumulate_if = cg_sum_adds_if(E, v->id);
        }
        E->dialect->embed_grad(&E->w, &k);
    } else {
        char qtable[64];
        int slot = quant_gather_slot(E, v);
        if (slot >= 0) {
            snprintf(qtable, sizeof qtable, "&ctx->quant[%d]", slot);
            k.qtable = qtable;
            k.qslot = slot;
            cg_line(&E->w, "/* %s's rows from its narrow copy, dequantized (--quantize-embeddings) */", V(E, v->operands[0])->name);
        } else {
            k.table = E->cname[v->operands[0]];
        }
        E->dialect->embed(&E->w, &k);
        E->dialect->fault_check(&E->w, 0);
        E->phase_faults = 1;
    }
}

/* Cross-entropy's three ops (ops.def): the statistics (v itself), the mean loss from
 * them, and the gradient, which reads the logits and the statistics. */
static void emit_loss(emitter *E, const ir_value *v) {
    const ir_value *stats = v->op == OP_XENT_STATS ? v : V(E, v->operands[v->op == OP_CROSS_ENTROPY ? 0 : 3]);
    const ir_value *logits = V(E, stats->operands[0]);
    const ir_type *local_logits = T(E, logits->id);
    char where[300], position_base[256];
    snprintf(where, sizeof where, "%s:%d", E->source_path, v->loc.line);
    cg_fault_position_base(E, stats->operands[1], position_base, sizeof position_base);
    cg_xent k = {.position_base = position_base, .classes = local_logits->shape[local_logits->rank - 1], .logits = E->cname[logits->id],
                 .targets = E->cname[stats->operands[1]], .stats = E->cname[stats->id], .out = E->cname[v->id],
                 .where = where, .fault_site = E->fault_site[v->id], .scratch = "ctx->scratch", .comm_size = 1};
    k.rows = ir_numel(local_logits) / k.classes;
    /* the mean is over every rank's rows: split rows leave a pending sum of shares */
    k.mean_rows = ir_numel(&logits->type) / logits->type.shape[logits->type.rank - 1];
    k.all_classes = k.classes;
    int class_axis = ir_class_split_axis(E->g, v);
    char comm[48], coord[48];
    if (class_axis != IR_REPLICATED) {
        snprintf(coord, sizeof coord, "ctx->coord[%d]", class_axis);
        k.coord = coord;
        k.comm_size = axis_size(E, class_axis);
        k.all_classes = k.classes * k.comm_size;
        if (v->op == OP_XENT_STATS) {
            snprintf(comm, sizeof comm, "ctx->comm[%d]", class_axis);
            k.comm = comm;
            k.logits_name = logits->name ? logits->name : E->cname[logits->id];
        }
    }
    char dloss[128];
    switch (v->op) {
    case OP_XENT_STATS:
        E->dialect->xent_stats(&E->w, &k);
        E->dialect->fault_check(&E->w, 0);
        E->phase_faults = 1;
        break;
    case OP_CROSS_ENTROPY: E->dialect->cross_entropy(&E->w, &k); break;
    default: {
        const ir_value *d = V(E, v->operands[2]);
        if (d->op == OP_CONST) const_text(E, d->id, dloss, sizeof dloss);
        else snprintf(dloss, sizeof dloss, "%s", E->cname[d->id]);
        k.dloss = dloss;
        k.dloss_is_buffer = d->op != OP_CONST;
        k.out_dtype = T(E, v->id)->dtype;
        if (k.out_dtype != DT_F32)
            cg_line(&E->w, "/* made in %s, each value rounded once: only products read it */", ir_dtype_name(k.out_dtype));
        if (dm_xent_grad_over_logits(E->plan, v))
            cg_line(&E->w, "/* written over %s, which nothing reads after it: each logit read before its gradient is stored */",
                    E->cname[logits->id]);
        E->dialect->cross_entropy_grad(&E->w, &k);
        break;
    }
    }
}

/* Fused attention and its backward (runtime/dmrt_attention.h) over the rank's heads. The
 * forward writes each row's log-sum-exp after its result (ir_storage_elems), where
 * attention_lse reads it; the backward writes dq, dk and dv one after the other, its
 * stacked result (each a third of it: grouped k and v's gradients at the start of theirs,
 * as ir_view_offset has them). Where the target runs it in 16 bits (g->attention_16bit) the kernel
 * casts in its scratch, sized as the memory pass sized it (dm_scratch_elems). */
static void emit_attention(emitter *E, const ir_value *v) {
    const ir_type *q = T(E, v->operands[0]);
    ir_attention_layout a = ir_attention_layout_of(v, q);
    int64_t n = ir_numel(q);
    char scale[64], lse[160], dk[160], dv[160];
    cg_float_literal(v->scalar, scale, sizeof scale);
    ir_dtype operands = E->g->attention_16bit ? E->g->product_dtype : DT_F32;
    cg_attention k = {.heads = a.heads, .inner = a.inner, .group = a.group, .positions = a.positions, .width = a.width,
                      .causal = v->causal,
                      .scale = scale, .q = E->cname[v->operands[0]], .k = E->cname[v->operands[1]],
                      .v = E->cname[v->operands[2]], .work = "ctx->scratch", .operands = operands,
                      .work_floats = E->dialect->attention_scratch_floats(a.heads, a.positions, a.width, operands),
                      .name = v->name ? v->name : "attention"};
    if (v->op == OP_ATTENTION) {
        snprintf(lse, sizeof lse, "%s + %lld", E->cname[v->id], (long long)n);
        k.out = E->cname[v->id], k.lse = lse;
        E->dialect->attention(&E->w, &k);
        return;
    }
    snprintf(dk, sizeof dk, "%s + %lld", E->cname[v->id], (long long)n);
    snprintf(dv, sizeof dv, "%s + %lld", E->cname[v->id], (long long)(2 * n));
    k.out = E->cname[v->operands[3]], k.lse = E->cname[v->operands[4]], k.dout = E->cname[v->operands[5]];
    k.dq = E->cname[v->id], k.dk = dk, k.dv = dv;
    E->dialect->attention_grad(&E->w, &k);
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
    cg_coalesce(&k);
    E->dialect->loop_nest(&E->w, &k);
}

static void emit_comm_call(emitter *E, const ir_value *v, const char *fmt, ...) {
    char args[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    const ir_value *src = V(E, v->operands[0]);
    char callee[96];
    cg_comm_callee(E, v->op == OP_ALLREDUCE ? "allreduce_sum" : v->op == OP_ALLGATHER ? "allgather"
                   : v->op == OP_REDUCE_SCATTER ? "reduce_scatter_sum" : "alltoall", callee, sizeof callee);
    cg_line(&E->w, "if (%sctx->comm[%d], %s, \"%s of %s (%s:%d)\") != 0) return comm_failed(ctx);", callee,
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
 *   shard slice     copy this rank's block, at an offset known at run time.
 *   as pending      coordinate 0 copies, the others zero (a whole value joins a sum). */
static void emit_collective(emitter *E, const ir_value *v) {
    const ir_type *in = T(E, v->operands[0]), *out = T(E, v->id);
    /* collectives move floats; integer tensors (token ids, labels) travel bit for bit,
     * and through scratch reinterpreted as their own type */
    int ints = in->dtype == DT_I32;
    char x_words[160], y_words[160];
    snprintf(x_words, sizeof x_words, ints ? "(const float *)%s" : "%s", E->cname[v->operands[0]]);
    snprintf(y_words, sizeof y_words, ints ? "(float *)%s" : "%s", E->cname[v->id]);
    const char *x = x_words, *y = y_words, *scratch = ints ? "((int32_t *)ctx->scratch)" : "ctx->scratch";
    const char *x_own = E->cname[v->operands[0]], *y_own = E->cname[v->id];
    int64_t k = axis_size(E, v->mesh_axis), n_in = ir_numel(in), n_out = ir_numel(out);
    int i = v->axis;
    switch (v->op) {
    case OP_ALLREDUCE:
        cg_copy_elems(E, y, x, (long long)n_in, "float", CG_DEVICE_TO_DEVICE);
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
            emit_copy_nest(E, 3, size, scratch, scratch_stride, y_own, whole_stride, n_out);
        } else {
            emit_copy_nest(E, 3, size, x_own, whole_stride, scratch, scratch_stride, n_in);
            emit_comm_call(E, v, "ctx->scratch, %s, %lld", y, (long long)n_out);
        }
        return;
    }
    case OP_ALLTOALL: {
        /* in: dim i split (block of it), dim j whole; out: dim i whole, dim j split */
        int j = v->axis2, rank = in->rank;
        int64_t in_stride[IR_MAX_RANK], out_stride[IR_MAX_RANK];
        cg_contiguous_strides(in, in_stride);
        cg_contiguous_strides(out, out_stride);
        /* a message is in's shape with dim j cut to out's block of it, contiguous */
        ir_type msg = *in;
        msg.shape[j] = out->shape[j];
        int64_t msg_stride[IR_MAX_RANK], size[IR_MAX_RANK + 1], from[IR_MAX_RANK + 1], to[IR_MAX_RANK + 1];
        cg_contiguous_strides(&msg, msg_stride);
        int64_t msg_elems = ir_numel(&msg);
        size[0] = k;
        for (int d = 0; d < rank; d++) size[d + 1] = msg.shape[d];
        /* pack: message r is in's block r of dim j */
        from[0] = msg.shape[j] * in_stride[j], to[0] = msg_elems;
        for (int d = 0; d < rank; d++) from[d + 1] = in_stride[d], to[d + 1] = msg_stride[d];
        emit_copy_nest(E, rank + 1, size, x_own, from, scratch, to, n_in);
        char recv[64], recv_own[80];
        snprintf(recv, sizeof recv, "(ctx->scratch + %lld)", (long long)n_in);
        snprintf(recv_own, sizeof recv_own, "(%s + %lld)", scratch, (long long)n_in);
        emit_comm_call(E, v, "ctx->scratch, %s, %lld", recv, (long long)msg_elems);
        /* unpack: the message from rank r is out's block r of dim i */
        from[0] = msg_elems, to[0] = in->shape[i] * out_stride[i];
        for (int d = 0; d < rank; d++) from[d + 1] = msg_stride[d], to[d + 1] = out_stride[d];
        emit_copy_nest(E, rank + 1, size, recv_own, from, y_own, to, n_out);
        return;
    }
    case OP_AS_PENDING:
        /* the sum over the axis is the value: coordinate 0 keeps it, the others add zeros */
        cg_line(&E->w, "if (ctx->coord[%d] == 0) {", v->mesh_axis);
        E->w.indent++;
        cg_copy_elems(E, y, x, (long long)n_in, "float", CG_DEVICE_TO_DEVICE);
        E->w.indent--;
        cg_line(&E->w, "} else {");
        E->w.indent++;
        cg_zero_elems(E, y, (long long)n_in, "float");
        E->w.indent--;
        cg_line(&E->w, "}");
        return;
    case OP_SHARD_SLICE: {
        int64_t in_stride[IR_MAX_RANK], out_stride[IR_MAX_RANK];
        cg_contiguous_strides(in, in_stride);
        cg_contiguous_strides(out, out_stride);
        char block[160];
        snprintf(block, sizeof block, "(%s + ctx->coord[%d] * %lld)", x_own, v->mesh_axis, (long long)(out->shape[i] * in_stride[i]));
        emit_copy_nest(E, out->rank, out->shape, block, in_stride, y_own, out_stride, n_out);
        return;
    }
    default: break;
    }
}

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
        cg_copy_elems(E, E->cname[id], E->cname[v->operands[0]], (long long)ir_numel(T(E, id)), "float",
                   CG_DEVICE_TO_DEVICE);
        if (begin < 0) begin = E->plan->offset[id], first_name = V(E, g->params[p])->name;
        end = E->plan->offset[id] + ir_numel(T(E, id));
        last_name = V(E, g->params[p])->name;
        members++;
    }
    char label[300];
    if (members == 1) snprintf(label, sizeof label, "allreduce of the gradient of %s", first_name);
    else snprintf(label, sizeof label, "allreduce of the gradients %s .. %s (%d)", first_name, last_name, members);
    if (emits_param_servers(E)) {
        cg_line(&E->w, "/* in place: pushed to the parameter servers with the step's other gradients, below */");
        return;
    }
    const dm_compress_bucket *compressed = dm_compress_bucket_of(E->compress, lead->id);
    if (compressed) {
        emit_compressed_reduce(E, compressed, label);
        return;
    }
    char callee[96];
    cg_comm_callee(E, bucket_started_early(E, lead->id) ? "allreduce_start" : "allreduce_sum", callee, sizeof callee);
    cg_line(&E->w, "if (%sctx->comm[%d], ctx->grads + %lld, %lld, \"%s\") != 0)", callee, lead->mesh_axis,
            (long long)begin, (long long)(end - begin), label);
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* In the backward pass, after value id: the bucket it completes (start_after: lead by
 * value, from bucket_ready) starts reducing. */
void emit_bucket_start(emitter *E, const int *start_after, int id) {
    if (start_after[id] < 0) return;
    cg_line(&E->w, "/* every gradient of this bucket is complete: reduce it while the pass goes on */");
    emit_bucket(E, V(E, start_after[id]));
}

/* At the end of the backward pass: the started buckets, done (once per axis). */
void emit_bucket_waits(emitter *E) {
    uint32_t axes = 0;
    for (int lead = 0; lead < E->g->n_values; lead++)
        if (bucket_started_early(E, lead)) axes |= 1u << V(E, lead)->mesh_axis;
    for (int a = 0; a < E->g->n_axes; a++)
        if (axes & (1u << a)) {
            cg_blank(&E->w);
            cg_line(&E->w, "/* the gradient buckets started above, reduced over %s */", E->g->axes[a].name);
            char callee[96];
            cg_line(&E->w, "if (%sctx->comm[%d]) != 0) return comm_failed(ctx);", cg_comm_callee(E, "comm_wait", callee, sizeof callee),
                    a);
        }
}


static void emit_update(emitter *E, const ir_value *v) {
    const dm_zero_bucket *zb = zero_bucket_of(E, v->param_index);
    if (zb && E->update_part == 2 && v->param_index == zb->first) {
        emit_zero_bucket_updates(E, zb);
        return;
    }
    if (zb) {
        cg_line(&E->w, "/* updated with its ZeRO bucket, at %s */", E->cname[E->update_part == 2 ? E->g->params[zb->first] : zb->lead]);
        return;
    }
    if (emits_param_servers(E)) {
        cg_line(&E->w, "/* updated by its parameter server (ps_update), below */");
        return;
    }
    if (emit_flat_update(E, v)) return;
    char count[32];
    snprintf(count, sizeof count, "%lld", (long long)ir_numel(T(E, v->operands[0])));
    ir_optimizer own;
    cg_update k = {.opt = cg_param_optimizer(E, v->param_index, &own), .count = count,
                   .param = E->cname[v->operands[0]], .grad = E->cname[v->operands[1]], .updates = cg_updates_done(E)};
    int mask = V(E, v->operands[v->n_operands - 1])->prune_mask, states = v->n_operands - 2 - mask;
    if (states > 0) k.state0 = E->cname[v->operands[2]];
    if (states > 1) k.state1 = E->cname[v->operands[3]];
    if (v->op == OP_SGD_UPDATE) E->dialect->sgd(&E->w, &k);
    else E->dialect->adamw(&E->w, &k);
    if (mask) emit_prune(E, v->operands[v->n_operands - 1]);
}

static void emit_op_body(emitter *E, const ir_value *v) {
    const ir_op_info *info = ir_op_info_of(v->op);
    if (v->op == OP_DROPOUT) {
        emit_dropout(E, v);
        return;
    }
    switch (info->cls) {
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_BINARY: emit_elementwise(E, v); break;
    case OPC_REDUCE:
    case OPC_BROADCAST: emit_reduce_or_broadcast(E, v); break;
    case OPC_RESHAPE:
        if (v->op == OP_PARAM_VIEW)
            emit_param_view(E, v);
        else if (shares_buffer(E, v->id))
            cg_line(&E->w, "/* %s shares the buffer of %s */", E->cname[v->id], E->cname[v->operands[0]]);
        else
            emit_copy(E, v);
        break;
    case OPC_TRANSPOSE: emit_transpose(E, v); break;
    case OPC_CAST: emit_cast(E, v); break;
    case OPC_MATMUL: emit_matmul(E, v); break;
    case OPC_ATTENTION: emit_attention(E, v); break;
    case OPC_VIEW:
        /* only temporaries are views (autodiff copies one that is a parameter's gradient) */
        cg_line(&E->w, "/* %s is read in place: %s of %s */", E->cname[v->id],
                v->op == OP_ATTENTION_LSE ? "the rows' log-sum-exp, after the result" : "a part of the stacked gradients",
                E->cname[v->operands[0]]);
        break;
    case OPC_LOSS:
    case OPC_LOSS_GRAD: emit_loss(E, v); break;
    case OPC_UPDATE: emit_update(E, v); break;
    case OPC_SOFTMAX:
    case OPC_MASK:
    case OPC_NORM: emit_rowwise(E, v); break;
    case OPC_SLICE: emit_slice(E, v); break;
    case OPC_GATHER: emit_embed(E, v); break;
    case OPC_COLLECTIVE:
        if (v->op == OP_ALLREDUCE && E->bucket_lead[v->id] >= 0 && zero_bucket_of(E, v->param_index)) {
            const dm_zero_bucket *zb = zero_bucket_of(E, v->param_index);
            if (zb->lead == v->id) emit_zero_bucket(E, zb);
            else cg_line(&E->w, "/* reduce-scattered with its ZeRO bucket, at %s */", E->cname[zb->lead]);
        } else if (v->op == OP_ALLREDUCE && E->bucket_lead[v->id] >= 0) {
            if (bucket_started_early(E, E->bucket_lead[v->id]))
                cg_line(&E->w, "/* reduced with its bucket during the backward pass */");
            else if (E->bucket_lead[v->id] == v->id) emit_bucket(E, v);
            else if (emits_param_servers(E)) cg_line(&E->w, "/* put in place with its bucket, at %s */", E->cname[E->bucket_lead[v->id]]);
            else cg_line(&E->w, "/* reduced with its bucket, at %s */", E->cname[E->bucket_lead[v->id]]);
        } else if (v->op == OP_ZERO_GATHER) {
            emit_zero_gather(E, v);
        } else {
            emit_collective(E, v);
        }
        break;
    case OPC_SOURCE: break;
    }
}

void emit_op(emitter *E, const ir_value *v) {
    const ir_op_info *info = ir_op_info_of(v->op);
    if (info->cls == OPC_SOURCE) return;
    char line[160], type[256];
    cg_source_line(E, v->loc.line, line, sizeof line);
    cg_shape_comment(E, &v->type, type, sizeof type);
    cg_blank(&E->w);
    cg_line(&E->w, "/* %s:%d: %s */", E->source_path, v->loc.line, line);
    if (v->type.dtype == DT_VOID)
        cg_line(&E->w, "/* %s(%s) */", info->name, E->cname[v->operands[0]]);
    else
        cg_line(&E->w, "/* %s = %s : %s */", E->cname[v->id], info->name, type);
    outline_op_begin(E);
    emit_op_body(E, v);
    outline_op_end(E, v);
}
