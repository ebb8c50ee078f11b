/* emit_quant.c: a quantized inference program (dmc --quantize int8-weights | int4-weights,
 * docs/compression.md). Every 2-D parameter that a forward product reads as its right
 * operand (x @ weight: weight [in, out]; or x @ transpose(weight), weight [out, in], read
 * so by every forward op reading it) gets a narrow copy in the context, a dmrt_qweight of
 * the product's [k, n] (transposed set for the second),
 * made from the f32 parameter at create (and again by the trainer after --init of an f32
 * file, or read from a --save-quantized file), and those products call the dialect's
 * quant_gemm on it. The rest of the program (biases, norms, softmax, the loss) is the f32
 * program's. Where the context's storage is separate (separate_memory: a GPU's), the
 * dmrt_qweight stays the host copy that the trainer reads and writes, and a copy of its
 * integers and scales in that memory (ctx->quant_data, ctx->quant_scale) is what the
 * products read: the descriptor's qweight_sync copies the host's there after each change. */
#include <stdlib.h>

#include "emitter.h"

/* Whether forward product v reads a parameter as its right operand, quantized (x @ W, or
 * x @ transpose(W): passes/quantize.c). */
static int reads_weight(const emitter *E, const ir_value *v) { return dm_quantized_weight_of(E->g, v) >= 0; }

/* The product's k (rows) and n (cols) of parameter value w, read transposed or not (W [n, k]
 * for x @ transpose(W): its narrow copy is the product's [k, n], made from and dequantized
 * into the transpose). */
static void product_shape(const emitter *E, int w, int transposed, int64_t *k, int64_t *n) {
    const ir_type *t = T(E, w);
    *k = t->shape[transposed ? 1 : 0];
    *n = ir_numel(t) / *k; /* a weight of more dims: [its first dim, the rest] */
}

void quant_mark(emitter *E) {
    const ir_graph *g = E->g;
    E->quant_slot = malloc(((size_t)g->n_values + 1) * sizeof(int));
    E->quant_param = malloc(((size_t)g->n_params + 1) * sizeof(int));
    E->quant_transposed = calloc((size_t)g->n_params + 1, 1);
    E->quant_narrow = calloc((size_t)g->n_params + 1, 1);
    char *transposed = calloc((size_t)g->n_values + 1, 1);
    if (!E->quant_slot || !E->quant_param || !E->quant_transposed || !E->quant_narrow || !transposed) abort();
    for (int i = 0; i < g->n_values; i++) E->quant_slot[i] = -1;
    if (!E->quant_bits) {
        free(transposed);
        return;
    }
    /* a weight read transposed is read so by every product that quantizes it (passes/quantize.c);
     * an embedding's table (--quantize-embeddings) is laid out so too: a scale per row */
    for (int i = 0; i < g->n_values; i++)
        if (reads_weight(E, V(E, i))) {
            int w = dm_quantized_weight_of(g, V(E, i));
            E->quant_slot[w] = 0;
            transposed[w] = (char)V(E, i)->trans_b;
        }
    for (int i = 0; i < g->n_values; i++) {
        int w = dm_quantized_table(g, V(E, i));
        if (w >= 0) E->quant_slot[w] = 0, transposed[w] = 1;
    }
    for (int p = 0; p < g->n_params; p++)
        if (E->quant_slot[g->params[p]] == 0) {
            E->quant_slot[g->params[p]] = E->n_quant;
            E->quant_transposed[E->n_quant] = transposed[g->params[p]];
            E->quant_narrow[E->n_quant] = (char)dm_weight_held_narrow(g, g->params[p]);
            E->n_narrow_only += E->quant_narrow[E->n_quant];
            E->quant_param[E->n_quant++] = p;
        }
    free(transposed);
    for (int i = 0; i < g->n_values; i++)
        if (E->quant_slot[i] == 0 && V(E, i)->role != ROLE_PARAM) E->quant_slot[i] = -1;
    for (int i = 0; i < g->n_values && E->dialect->quant_work_bytes; i++) {
        if (!is_quant_product(E, V(E, i))) continue;
        int64_t k, n, col0;
        product_shape(E, dm_quantized_weight_of(g, V(E, i)), V(E, i)->trans_b, &k, &n);
        (void)dm_quantized_window(g, V(E, i), &col0, &n); /* the columns it reads */
        int64_t m = ir_numel(T(E, i)) / n;
        int64_t bytes = E->dialect->quant_work_bytes(E->quant_act, m, k, n);
        if (bytes > E->quant_work_bytes) E->quant_work_bytes = bytes;
    }
}

/* "int8", "int8-weights", "int4-weights:64": --quantize's spelling of the mode */
static void quant_mode(const emitter *E, char *out, size_t len) {
    if (E->quant_act) snprintf(out, len, "int8");
    else if (E->quant_bits == 8) snprintf(out, len, "int8-weights");
    else snprintf(out, len, "int4-weights:%lld", (long long)E->quant_group);
}

void emit_quant_fields(emitter *E) {
    if (!E->n_quant) return;
    char mode[48];
    quant_mode(E, mode, sizeof mode);
    cg_line(&E->w, "dmrt_qweight quant[%d]; /* (--quantize %s) the weights the forward's products read */", E->n_quant, mode);
    if (!E->dialect->separate_memory) return;
    cg_line(&E->w, "uint8_t *quant_data[%d]; /* their integers and scales where the products read them (quant_upload) */",
            E->n_quant);
    cg_line(&E->w, "float *quant_scale[%d];", E->n_quant);
    if (E->quant_work_bytes) cg_line(&E->w, "void *quant_work; /* %lld bytes the products work in */", (long long)E->quant_work_bytes);
}

/* Separate memory: quant_upload(ctx, j), the host copy of narrow weight j into the products'
 * memory, and (where some weight keeps its f32 copy) quant_from_params(ctx, j), weight j
 * quantized from its f32 parameter (and that set to the dequantized values) through host
 * memory, as dmrt_quantize_params does. */
void emit_quant_support(emitter *E) {
    cg_writer *w = &E->w;
    if (!E->n_quant || !E->dialect->separate_memory) return;
    cg_line(w, "static int quant_upload(struct_ctx *ctx, int j) {");
    w->indent++;
    cg_line(w, "const dmrt_qweight *q = &ctx->quant[j];");
    E->dialect->copy(w, "ctx->quant_data[j]", "q->data", "(size_t)dmrt_qweight_bytes(q)", CG_HOST_TO_DEVICE, E->on_fail);
    E->dialect->copy(w, "ctx->quant_scale[j]", "q->scale", "(size_t)(dmrt_qweight_groups(q) * q->cols) * sizeof(float)",
                     CG_HOST_TO_DEVICE, E->on_fail);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    if (E->n_narrow_only == E->n_quant) return; /* every weight held narrow only: none to quantize from its f32 copy */
    cg_line(w, "static int quant_from_params(struct_ctx *ctx, int j, int p) {");
    w->indent++;
    cg_line(w, "dmrt_qweight *q = &ctx->quant[j];");
    cg_line(w, "float *host = (float *)dmrt_alloc((size_t)(q->rows * q->cols) * sizeof(float));");
    cg_line(w, "if (!host) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory\");", E->g->model);
    cg_line(w, "    return DMRT_ERR_NOMEM;");
    cg_line(w, "}");
    cg_line(w, "int status = gather_param(ctx, p, 0, host);");
    cg_line(w, "if (status == DMRT_OK) {");
    cg_line(w, "    dmrt_quantize_weight(q, host);");
    cg_line(w, "    dmrt_dequantize_param(q, host);");
    cg_line(w, "    status = scatter_param(ctx, p, host);");
    cg_line(w, "}");
    cg_line(w, "dmrt_free(host);");
    cg_line(w, "return status == DMRT_OK ? quant_upload(ctx, j) : status;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* In create: a failed allocation in the products' memory (device_failed names it). */
#define DEVICE_ALLOC_FAILED "{ (void)device_failed(ctx); goto fail; }"

/* Whether a quantized product reads weight w (not only embeddings). */
static int read_by_product(const emitter *E, int w) {
    for (int i = 0; i < E->g->n_values; i++)
        if (dm_quantized_weight_of(E->g, V(E, i)) == w) return 1;
    return 0;
}

int quant_narrow_slot(const emitter *E, int p) {
    int slot = E->quant_bits ? E->quant_slot[E->g->params[p]] : -1;
    return slot >= 0 && E->quant_narrow[slot] ? slot : -1;
}

void emit_quant_alloc(emitter *E) {
    cg_writer *w = &E->w;
    if (E->quant_work_bytes && E->n_quant) {
        char bytes[32];
        snprintf(bytes, sizeof bytes, "%lld", (long long)E->quant_work_bytes);
        E->dialect->alloc(w, "ctx->quant_work", bytes, DEVICE_ALLOC_FAILED);
    }
    for (int j = 0; j < E->n_quant; j++) {
        int p = E->quant_param[j];
        const ir_value *v = V(E, E->g->params[p]);
        int64_t k, n;
        int transposed = E->quant_transposed[j];
        product_shape(E, v->id, transposed, &k, &n);
        cg_line(w, "/* %s%s%s */", v->name, transposed ? ", read transposed: stored as the product's [k, n], its transpose" : "",
                quant_narrow_slot(E, p) >= 0 ? ", held narrow only (no f32 copy)" : "");
        cg_line(w, "if (dmrt_qweight_init(&ctx->quant[%d], %d, %lld, %lld, %lld) != 0) goto oom;", j, E->quant_bits,
                (long long)k, (long long)n, (long long)E->quant_group);
        if (transposed) cg_line(w, "ctx->quant[%d].transposed = 1;", j);
        if (quant_narrow_slot(E, p) >= 0) cg_line(w, "ctx->quant[%d].narrow_only = 1;", j);
        /* int8: its input scale comes from the trainer's calibration or a --save-quantized file
         * (a table only embeddings read has no input) */
        if (E->quant_act && read_by_product(E, v->id)) cg_line(w, "ctx->quant[%d].quantize_input = 1;", j);
        if (!E->dialect->separate_memory) continue;
        char lhs[64], bytes[160];
        snprintf(lhs, sizeof lhs, "ctx->quant_data[%d]", j);
        snprintf(bytes, sizeof bytes, "(size_t)dmrt_qweight_bytes(&ctx->quant[%d])", j);
        E->dialect->alloc(w, lhs, bytes, DEVICE_ALLOC_FAILED);
        snprintf(lhs, sizeof lhs, "ctx->quant_scale[%d]", j);
        snprintf(bytes, sizeof bytes, "(size_t)(dmrt_qweight_groups(&ctx->quant[%d]) * ctx->quant[%d].cols) * sizeof(float)",
                 j, j);
        E->dialect->alloc(w, lhs, bytes, DEVICE_ALLOC_FAILED);
    }
}

void emit_quant_create(emitter *E) {
    cg_writer *w = &E->w;
    for (int j = 0; j < E->n_quant; j++) {
        int p = E->quant_param[j];
        if (quant_narrow_slot(E, p) >= 0) { /* init_params quantized it: its products' copy follows */
            if (E->dialect->separate_memory) cg_line(w, "if (quant_upload(ctx, %d) != DMRT_OK) goto fail;", j);
            continue;
        }
        if (E->dialect->separate_memory) {
            cg_line(w, "if (quant_from_params(ctx, %d, %d) != DMRT_OK) goto fail;", j, p);
        } else {
            cg_line(w, "dmrt_quantize_weight(&ctx->quant[%d], ctx->params + ctx->param_offsets[%d]);", j, p);
            cg_line(w, "dmrt_dequantize_param(&ctx->quant[%d], ctx->params + ctx->param_offsets[%d]);", j, p);
        }
    }
}

/* quantize_narrow(ctx, j, p, whole): weight j (parameter p), held narrow only, quantized
 * from an aligned copy of whole (a file's tensor may lie at any address); where the
 * products read another copy (separate memory), that copy follows (quant_upload). */
void emit_quantize_narrow(emitter *E) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    if (E->dialect->separate_memory) cg_line(w, "static int quant_upload(struct_ctx *ctx, int j); /* below */");
    cg_line(w, "/* Weight j, held narrow only, quantized from whole. */");
    cg_line(w, "static int quantize_narrow(struct_ctx *ctx, int j, int p, const float *whole) {");
    w->indent++;
    cg_line(w, "size_t bytes = (size_t)param_descs[p].numel * sizeof(float);");
    cg_line(w, "float *aligned = (float *)dmrt_alloc(bytes);");
    cg_line(w, "if (!aligned) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory\");", m);
    cg_line(w, "    return DMRT_ERR_NOMEM;");
    cg_line(w, "}");
    cg_line(w, "memcpy(aligned, whole, bytes);");
    cg_line(w, "dmrt_quantize_weight(&ctx->quant[j], aligned);");
    cg_line(w, "dmrt_free(aligned);");
    cg_line(w, "return %s;", E->dialect->separate_memory ? "quant_upload(ctx, j)" : "DMRT_OK");
    w->indent--;
    cg_line(w, "}");
}

void emit_narrow_param_cases(emitter *E, int gather) {
    cg_writer *w = &E->w;
    const ir_graph *g = E->g;
    if (!E->n_narrow_only) return;
    cg_line(w, "switch (p) { /* held narrow only (no f32 copy): %s */", gather ? "dequantized" : "quantized");
    for (int p = 0; p < g->n_params; p++) {
        int j = quant_narrow_slot(E, p);
        if (j < 0) continue;
        if (gather)
            cg_line(w, "case %d: dmrt_dequantize_param(&ctx->quant[%d], whole); return DMRT_OK; /* %s */", p, j,
                    V(E, g->params[p])->name);
        else cg_line(w, "case %d: return quantize_narrow(ctx, %d, p, whole); /* %s */", p, j, V(E, g->params[p])->name);
    }
    cg_line(w, "default: break;");
    cg_line(w, "}");
}

void emit_narrow_param_copies(emitter *E) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    emit_quantize_narrow(E);
    cg_line(w, "/* Parameter p into whole: a weight held narrow only (no f32 copy) dequantized. */");
    cg_line(w, "static int gather_param(struct_ctx *ctx, int p, int grad, float *whole) {");
    w->indent++;
    cg_line(w, "if (grad) { /* a --quantize program has no gradients */");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: a --quantize program has no gradients\");", m);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    emit_narrow_param_cases(E, 1);
    cg_line(w, "memcpy(whole, ctx->params + ctx->param_offsets[p], (size_t)param_descs[p].numel * sizeof(float));");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "/* Parameter p from whole: a weight held narrow only quantized from it. */");
    cg_line(w, "static int scatter_param(struct_ctx *ctx, int p, const float *whole) {");
    w->indent++;
    emit_narrow_param_cases(E, 0);
    cg_line(w, "memcpy(ctx->params + ctx->param_offsets[p], whole, (size_t)param_descs[p].numel * sizeof(float));");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_quant_destroy(emitter *E) {
    for (int j = 0; j < E->n_quant; j++) {
        cg_line(&E->w, "dmrt_qweight_free(&ctx->quant[%d]);", j);
        if (!E->dialect->separate_memory) continue;
        char ptr[64];
        snprintf(ptr, sizeof ptr, "ctx->quant_data[%d]", j);
        E->dialect->free(&E->w, ptr);
        snprintf(ptr, sizeof ptr, "ctx->quant_scale[%d]", j);
        E->dialect->free(&E->w, ptr);
    }
    if (E->quant_work_bytes && E->n_quant) E->dialect->free(&E->w, "ctx->quant_work");
}

/* model_qweight, the descriptor's accessor */
void emit_quant_accessor(emitter *E) {
    cg_writer *w = &E->w;
    if (!E->n_quant) return;
    cg_line(w, "static dmrt_qweight *model_qweight(void *ctx, int i) {");
    cg_line(w, "    switch (i) {");
    for (int j = 0; j < E->n_quant; j++)
        cg_line(w, "    case %d: return &((struct_ctx *)ctx)->quant[%d];", E->quant_param[j], j);
    cg_line(w, "    default: return NULL;");
    cg_line(w, "    }");
    cg_line(w, "}");
    if (!E->dialect->separate_memory) return;
    cg_line(w, "static int model_qweight_sync(void *ctx, int i) {");
    cg_line(w, "    switch (i) {");
    for (int j = 0; j < E->n_quant; j++)
        cg_line(w, "    case %d: return quant_upload((struct_ctx *)ctx, %d);", E->quant_param[j], j);
    cg_line(w, "    default: return DMRT_OK;");
    cg_line(w, "    }");
    cg_line(w, "}");
}

void emit_quant_descriptor(emitter *E) {
    char mode[48];
    quant_mode(E, mode, sizeof mode);
    if (E->n_quant) cg_line(&E->w, ".quantize = \"%s\",", mode);
    else cg_line(&E->w, ".quantize = NULL,");
    cg_line(&E->w, ".qweight = %s,", E->n_quant ? "model_qweight" : "NULL");
    cg_line(&E->w, ".qweight_sync = %s,", E->n_quant && E->dialect->separate_memory ? "model_qweight_sync" : "NULL");
}

int is_quant_product(const emitter *E, const ir_value *v) {
    int w = dm_quantized_weight_of(E->g, v);
    return w >= 0 && E->quant_slot[w] >= 0;
}

int quant_gather_slot(const emitter *E, const ir_value *v) {
    int w = dm_quantized_table(E->g, v);
    return w >= 0 ? quant_narrow_slot(E, V(E, w)->param_index) : -1;
}

int emit_quant_product(emitter *E, const ir_value *v, const cg_gemm *k) {
    if (!is_quant_product(E, v)) return 0;
    int j = E->quant_slot[dm_quantized_weight_of(E->g, v)];
    int64_t col0, cols;
    int window = dm_quantized_window(E->g, v, &col0, &cols) == 1;
    char w_f32[96];
    /* the f32 weight: what the calibration's f32 forward multiplies (none held narrow only) */
    if (quant_narrow_slot(E, E->quant_param[j]) >= 0) snprintf(w_f32, sizeof w_f32, "NULL");
    else if (window)
        snprintf(w_f32, sizeof w_f32, "ctx->params + ctx->param_offsets[%d] + %lld", E->quant_param[j], (long long)col0);
    else snprintf(w_f32, sizeof w_f32, "ctx->params + ctx->param_offsets[%d]", E->quant_param[j]);
    cg_quant_gemm q = {.slot = j, .activations = E->quant_act, .m = k->m, .lda = k->lda, .ldc = k->ldc, .a = k->a,
                       .c = k->c, .w_f32 = w_f32, .b = k->b, .accumulate = k->accumulate,
                       .col0 = window ? col0 : 0, .cols = window ? cols : 0};
    if (window) {
        int64_t rows, n;
        product_shape(E, E->g->params[E->quant_param[j]], 0, &rows, &n);
        cg_line(&E->w, "/* its columns %lld to %lld of %s's narrow [%lld, %lld] */", (long long)col0, (long long)(col0 + cols),
                V(E, E->g->params[E->quant_param[j]])->name, (long long)rows, (long long)n);
    }
    E->dialect->quant_gemm(&E->w, &q);
    return 1;
}

/* --quantize int8: a forward (the API's _forward, _predict) refuses to start before every
 * product's input scale is calibrated, instead of dmrt_gemm_i8_split's abort. */
void emit_quant_ready_check(emitter *E) {
    if (!E->quant_act) return;
    cg_line(&E->w, "if (dmrt_quant_ready(&%s_model, ctx, ctx->error, sizeof ctx->error) != 0) return DMRT_ERR_ARG;",
            E->g->model);
}
