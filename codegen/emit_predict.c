/* emit_predict.c: inference, <model>_predict. The forward pass's own functions run with
 * ctx->predicting set: the ops the outputs do not need (the loss and what only it reads,
 * the targets' reads among them) are skipped by a guard around them, so there is one
 * forward, not a second copy. predict pads a short batch with zero rows, runs the forward
 * on every rank (pipelines: through the stages), gathers the outputs whole as the output
 * accessors do, and returns the first `rows` rows of each.
 *
 * Needs: the outputs and the inputs they read to share their first dim (the batch), and
 * ops that mix rows only in the loss (true of the language: reductions over the batch are
 * the loss's). In a separate memory (CUDA) the padded batch is copied in as a step's is
 * (emit_upload) and the outputs come out through their accessors' host copies. */
#include <stdlib.h>
#include <string.h>

#include "batch_rows.h"
#include "emitter.h"

/* E->for_outputs: the forward values the outputs need, through operands. */
void predict_mark(emitter *E) {
    const ir_graph *g = E->g;
    unsigned char *need = calloc((size_t)g->n_values + 1, 1);
    if (!need) abort();
    for (int i = 0; i < g->n_outputs; i++) need[g->outputs[i]] = 1;
    for (int i = g->n_values - 1; i >= 0; i--) {
        if (!need[i]) continue;
        const ir_value *v = V(E, i);
        for (int k = 0; k < v->n_operands; k++) need[v->operands[k]] = 1;
    }
    E->for_outputs = need;
}

/* Whether forward op id runs in predict. Values of the other phases are never guarded. */
int predict_runs(const emitter *E, int id) {
    return V(E, id)->phase != PHASE_FORWARD || E->for_outputs[id];
}

/* A value the outputs need that combines rows of the batch (dim `batch`: ir_mixes_rows),
 * except reshapes (they move no element, and name their dims anew); -1 when none. */
static int mixes_rows(const emitter *E, const char *batch) {
    for (int i = 0; i < E->g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (!E->for_outputs[i] || v->phase != PHASE_FORWARD) continue;
        if (ir_op_info_of(v->op)->cls == OPC_RESHAPE || ir_op_info_of(v->op)->cls == OPC_SOURCE) continue;
        if (ir_mixes_rows(E->g, v, batch)) return i;
    }
    return -1;
}

/* The rows of one predict call (the batch dim), or 0 with why it cannot predict. */
static int64_t predict_batch(const emitter *E, char *why, size_t len) {
    const ir_graph *g = E->g;
    const ir_type *first = NULL;
    snprintf(why, len, "%s", "");
    if (!E->dialect->can.predict) return snprintf(why, len, "predict is not supported on the %s target yet", E->dialect->name), 0;
    if (!g->n_outputs) return snprintf(why, len, "the model declares no outputs"), 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < (pass ? g->n_outputs : g->n_inputs); i++) {
            int id = pass ? g->outputs[i] : g->inputs[i];
            const ir_type *t = &V(E, id)->type;
            if (!E->for_outputs[id]) continue;
            if (pass && E->plan->region[id] == REGION_INPUT)
                return snprintf(why, len, "output %s is an input", V(E, id)->name), 0;
            int same = first && t->rank >= 1 && t->shape[0] == first->shape[0] &&
                       (!t->dim_name[0] || !first->dim_name[0] || strcmp(t->dim_name[0], first->dim_name[0]) == 0);
            if (t->rank < 1 || (first && !same))
                return snprintf(why, len, "%s %s does not start with the batch dim", pass ? "output" : "input", V(E, id)->name), 0;
            if (!first) first = t;
        }
    int mix = first->dim_name[0] ? mixes_rows(E, first->dim_name[0]) : -1;
    if (mix >= 0) {
        char line[160];
        cg_source_line(E, V(E, mix)->loc.line, line, sizeof line);
        /* in a C string and a format: no quote, backslash or percent sign */
        for (char *c = line; *c; c++)
            if (*c == '"' || *c == '\\' || *c == '%') *c = '?';
        return snprintf(why, len, "%s:%d combines rows of the batch dim %s: %s", E->source_path, V(E, mix)->loc.line,
                        first->dim_name[0], line), 0;
    }
    /* micro-batches: values are typed per micro-batch; the batch is M of them */
    return first->shape[0] * (E->scheduled && g->microbatches > 1 ? g->microbatches : 1);
}

/* Elements of one row of value id (its first dim is the batch's). */
static long long row_elems(const emitter *E, int id) {
    const ir_type *t = &V(E, id)->type;
    return (long long)(ir_numel(t) / t->shape[0]);
}

/* The header's part: the outputs' struct and the prototype. */
void emit_predict_decl(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    char why[256], type[256];
    int64_t B = predict_batch(E, why, sizeof why);
    cg_line(w, "/* Where %s_predict writes the outputs: `rows` rows of each, row-major. */", m);
    cg_line(w, "typedef struct %s_outputs {", m);
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        cg_shape_comment(E, &v->type, type, sizeof type);
        cg_line(w, "    %s *%s; /* %s, its first %s rows */", ctype(v->type.dtype), E->cname[v->id], type,
                v->type.rank && v->type.dim_name[0] ? v->type.dim_name[0] : "dim's");
    }
    if (!g->n_outputs) cg_line(w, "    int unused; /* the model has no outputs */");
    cg_line(w, "} %s_outputs;", m);
    cg_blank(w);
    if (B) {
        cg_line(w, "/* Inference: the outputs of the first `rows` rows (1 to %lld) of batch into out. Runs the", (long long)B);
        cg_line(w, " * forward ops the outputs need, not the loss; inputs they do not need are not read (may");
        cg_line(w, " * be NULL). Rows do not influence each other: a short batch is padded with zeros.%s */",
                E->partitioned ? "\n * Every rank calls it with the same arguments (a collective)" : "");
    } else {
        cg_line(w, "/* Inference: not available for this model (%s); returns DMRT_ERR_ARG. */", why);
    }
    cg_line(w, "int %s_predict(%s_ctx *ctx, const %s_batch *batch, int64_t rows, const %s_outputs *out);", m, m, m, m);
    cg_blank(w);
}

/* A short batch: the needed inputs, padded with zero rows, into `padded`. */
static void emit_padding(emitter *E, int64_t B) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* the inputs the outputs need: a short batch padded with zero rows */");
    cg_line(w, "%s_batch padded;", g->model);
    cg_line(w, "memset(&padded, 0, sizeof padded);");
    cg_line(w, "void *pads[%d] = {0};", g->n_inputs ? g->n_inputs : 1);
    cg_line(w, "int status = DMRT_OK;");
    for (int i = 0; i < g->n_inputs; i++) {
        const ir_value *v = V(E, g->inputs[i]);
        const char *c = E->cname[v->id], *t = ctype(v->type.dtype);
        long long row = row_elems(E, v->id);
        if (!E->for_outputs[v->id]) {
            /* in a separate memory the upload copies every input whole (whatever its first
             * dim): zeros of that size, never the caller's buffer, which may hold fewer rows
             * (or be NULL) */
            const int upload = E->dialect->separate_memory;
            char zeros[160];
            snprintf(zeros, sizeof zeros, "(const %s *)(pads[%d] = calloc(%lld, sizeof(%s)))", t, i,
                     upload ? (long long)emit_upload_elems(E, v) : row * (long long)B, t);
            if (upload) {
                cg_line(w, "/* %s: not read; zeros are uploaded in its place */", v->name);
                cg_line(w, "padded.%s = %s;", c, zeros);
            } else {
                /* the address of this rank's block is still formed (not read): not from NULL */
                cg_line(w, "/* %s: not read; zeros stand in for NULL */", v->name);
                cg_line(w, "padded.%s = batch->%s ? batch->%s : %s;", c, c, c, zeros);
            }
            cg_line(w, "if (!padded.%s) status = DMRT_ERR_NOMEM;", c);
            continue;
        }
        cg_line(w, "if (!batch->%s) {", c);
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: predict: input %s is NULL\");", g->model, v->name);
        cg_line(w, "    status = DMRT_ERR_ARG;");
        cg_line(w, "} else if (rows < %lld) {", (long long)B);
        cg_line(w, "    %s *pad = (%s *)calloc(%lld, sizeof(%s));", t, t, row * (long long)B, t);
        cg_line(w, "    if (pad) memcpy(pad, batch->%s, (size_t)rows * %lld * sizeof(%s));", c, row, t);
        cg_line(w, "    else status = DMRT_ERR_NOMEM;");
        cg_line(w, "    padded.%s = pad, pads[%d] = pad;", c, i);
        cg_line(w, "} else {");
        cg_line(w, "    padded.%s = batch->%s;", c, c);
        cg_line(w, "}");
    }
    cg_line(w, "if (status == DMRT_ERR_NOMEM) snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory\");", g->model);
}

/* <model>_predict and the descriptor's wrapper of it. */
void emit_predict_api(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    char why[256];
    int64_t B = predict_batch(E, why, sizeof why);
    if (B && E->dialect->separate_memory) {
        /* the step's copies of the caller's batch into the context's inputs, as a function:
         * a failed copy returns, and predict frees its padding */
        cg_line(w, "/* predict's batch (host memory) into the context's inputs, as a step's is. */");
        cg_line(w, "static int predict_upload(struct_ctx *ctx, const %s_batch *batch) {", m);
        w->indent++;
        emit_upload(E);
        cg_line(w, "return DMRT_OK;");
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
    }
    cg_line(w, "int %s_predict(%s_ctx *ctx, const %s_batch *batch, int64_t rows, const %s_outputs *out) {", m, m, m, m);
    w->indent++;
    if (!B) {
        cg_line(w, "(void)batch; (void)rows; (void)out;");
        cg_line(w, "snprintf(ctx->error, sizeof ctx->error, \"%s: %s\");", m, why);
        cg_line(w, "return DMRT_ERR_ARG;");
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
        return;
    }
    cg_line(w, "ctx->error[0] = 0;");
    emit_quant_ready_check(E);
    cg_line(w, "if (rows < 1 || rows > %lld) {", (long long)B);
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: predict: %%lld rows, expected 1 to %lld\", (long long)rows);", m,
            (long long)B);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    emit_padding(E, B);
    cg_line(w, "/* the forward pass without the ops only the loss needs */");
    if (E->dialect->separate_memory) cg_line(w, "if (status == DMRT_OK) status = predict_upload(ctx, &padded);");
    cg_line(w, "ctx->predicting = 1;");
    if (E->scheduled) {
        cg_line(w, "if (status == DMRT_OK) {");
        if (E->stages == 1) {
            cg_line(w, "    status = stage0_infer(ctx, &padded);");
        } else {
            cg_line(w, "    switch (ctx->coord[PIPELINE_AXIS]) {");
            for (int r = 0; r < E->ranks; r++)
                cg_line(w, "    case %d: status = %s%d_infer(ctx, &padded); break;", r, E->chunks > 1 ? "rank" : "stage", r);
            cg_line(w, "    default: status = DMRT_ERR_ARG; break;");
            cg_line(w, "    }");
        }
        cg_line(w, "}");
        cg_line(w, "if (status == DMRT_OK) status = finish_forward(ctx, NULL);");
    } else {
        cg_line(w, "if (status == DMRT_OK) status = run_forward(ctx, &padded);");
        if (emits_step_end(E)) cg_line(w, "if (status == DMRT_OK) status = finish_step(ctx, NULL);");
    }
    cg_line(w, "ctx->predicting = 0;");
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        const char *t = ctype(v->type.dtype);
        cg_line(w, "/* %s: gathered whole, its first rows */", v->name);
        cg_line(w, "if (status == DMRT_OK) {");
        cg_line(w, "    const %s *whole = %s_output_%s(ctx);", t, m, E->cname[v->id]);
        cg_line(w, "    if (!whole) status = DMRT_ERR_COMM;");
        cg_line(w, "    else memcpy(out->%s, whole, (size_t)rows * %lld * sizeof(%s));", E->cname[v->id], row_elems(E, v->id), t);
        cg_line(w, "}");
    }
    cg_line(w, "for (int i = 0; i < %d; i++) free(pads[i]);", g->n_inputs ? g->n_inputs : 1);
    cg_line(w, "return status;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The descriptor's wrapper (after batch_of) and which inputs predict reads. */
void emit_predict_wrapper(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "static int model_predict(void *ctx, const void *const *inputs, int64_t rows, void *const *outputs) {");
    cg_line(w, "    %s_batch batch = batch_of(inputs);", g->model);
    cg_line(w, "    %s_outputs out;", g->model);
    cg_line(w, "    memset(&out, 0, sizeof out);");
    if (!g->n_outputs) cg_line(w, "    (void)outputs;");
    for (int i = 0; i < g->n_outputs; i++)
        cg_line(w, "    out.%s = (%s *)outputs[%d];", E->cname[g->outputs[i]], ctype(V(E, g->outputs[i])->type.dtype), i);
    cg_line(w, "    return %s_predict((struct_ctx *)ctx, &batch, rows, &out);", g->model);
    cg_line(w, "}");
    cg_line(w, "/* 1: predict reads input i (the outputs need it) */");
    cg_line(w, "static const unsigned char predict_reads[%d] = {", g->n_inputs ? g->n_inputs : 1);
    for (int i = 0; i < g->n_inputs; i++) cg_line(w, "    %d, /* %s */", E->for_outputs[g->inputs[i]] ? 1 : 0, V(E, g->inputs[i])->name);
    if (!g->n_inputs) cg_line(w, "    0,");
    cg_line(w, "};");
}

/* The descriptor's fields of predict. */
void emit_predict_fields(emitter *E) {
    char why[256];
    int64_t B = predict_batch(E, why, sizeof why);
    cg_line(&E->w, ".predict = model_predict,");
    cg_line(&E->w, ".predict_batch = %lld,", (long long)B);
    cg_line(&E->w, ".predict_reads = predict_reads,");
    cg_line(&E->w, ".predict_unsupported = %s%s%s,", B ? "" : "\"", B ? "NULL" : why, B ? "" : "\"");
}

/* Around forward op id (emit_phase): in predict, only what the outputs need runs. */
void predict_guard(emitter *E, int id, int *open) {
    int skip = !predict_runs(E, id);
    if (skip == *open) return;
    if (skip) {
        cg_line(&E->w, "if (!ctx->predicting) { /* the loss's part: predict skips it */");
        E->w.indent++;
    } else {
        E->w.indent--;
        cg_line(&E->w, "}");
    }
    *open = skip;
}
