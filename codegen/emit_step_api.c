/* emit_step_api.c: the public step functions of the generated code: <model>_forward,
 * <model>_train_step and the outputs' accessors, serial or over the stages' schedules
 * (the functions they call: emit_step.c). */
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

/* A --quantize program's train_step: refused. Its products read the narrow weights made at
 * create and load, which an update of the f32 parameters would not change (the update would
 * be lost), so the backward and update are generated but never run. */
static void refuse_quantized_train_step(emitter *E) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    cg_line(w, "/* a --quantize program predicts and evaluates only: its products read the narrow weights");
    cg_line(w, " * made at create and load, which an update would not change */");
    cg_line(w, "(void)batch; (void)loss;");
    int trains = g->loss >= 0 && g->grads; /* emit_source_body's condition for the two */
    if (trains) cg_line(w, "(void)run_backward;");
    if (trains && g->optimizer.kind != OPTIM_NONE) cg_line(w, "(void)run_update;");
    if (emits_update(E)) cg_line(w, "(void)next_learning_rate;");
    cg_line(w, "snprintf(ctx->error, sizeof ctx->error, \"%s: train_step: a --quantize program predicts and evaluates "
               "only (train the f32 program, then quantize its weights)\");", g->model);
    cg_line(w, "return DMRT_ERR_ARG;");
}

/* The head of <model>_train_step; for a model without a loss or quantized, all of its
 * body: 0. */
static int open_train_step(emitter *E) {
    const char *m = E->g->model;
    cg_line(&E->w, "int %s_train_step(%s_ctx *ctx, const %s_batch *batch, float *loss) {", m, m, m);
    E->w.indent++;
    if (E->quant_bits) {
        refuse_quantized_train_step(E);
        return 0;
    }
    if (emits_2bw(E) && !dm_runs_pipedream(E->g)) /* the stream's first step makes no update */
        cg_line(&E->w, "if (ctx->owed >= 0 && next_learning_rate(ctx) != DMRT_OK) return DMRT_ERR_ARG;");
    else if (emits_update(E))
        cg_line(&E->w, "if (next_learning_rate(ctx) != DMRT_OK) return DMRT_ERR_ARG;");
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
    /* interleaved, a rank's step runs its chunks' stages */
    const char *unit = E->chunks > 1 ? "rank" : "stage";
    cg_line(w, "switch (ctx->coord[PIPELINE_AXIS]) {");
    for (int r = 0; r < E->ranks; r++) cg_line(w, "case %d: status = %s%d_%s(%s); break;", r, unit, r, what, args);
    cg_line(w, "default: status = DMRT_ERR_ARG; break;");
    cg_line(w, "}");
}

/* <model>_output_NAME: where (a C expression) holds n elements; in a separate memory, a
 * copy of them in host memory. */
/* The body of an accessor gathering output v whole from every rank's block: each rank
 * writes its block of each micro-batch into zeros, then the ranks sum over every axis that
 * splits it (x + 0 is exact), holds a pending sum of it, or is the pipeline (only the
 * output's stage has it). local holds n elements: micro-batches of this rank's block. */
static void emit_output_gather(emitter *E, const ir_value *v, const char *local, long long n) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    const ir_type *whole = &v->type, *block = T(E, v->id);
    long long M = g->microbatches > 1 && E->scheduled ? g->microbatches : 1, n_whole = (long long)ir_numel(whole);
    cg_line(w, "struct_ctx *ctx = (struct_ctx *)ctx_; /* a failed gather leaves its message in ctx->error */");
    if (E->dialect->separate_memory) {
        char dst[160];
        snprintf(dst, sizeof dst, "ctx->host_output_%s", E->cname[v->id]);
        const char *saved = E->on_fail;
        E->on_fail = "return NULL;";
        /* on a pipeline only the output's stage holds it (the others' buffer has no bytes:
         * a copy of n elements there would read past the device block) */
        if (E->pipe_axis >= 0) {
            cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == %d) { /* the output's stage */", rank_of(E, v->stage));
            w->indent++;
        }
        cg_copy_elems(E, dst, local, n, "float", CG_DEVICE_TO_HOST);
        if (E->pipe_axis >= 0) {
            w->indent--;
            cg_line(w, "}");
        }
        E->on_fail = saved;
        cg_line(w, "const float *local = ctx->host_output_%s;", E->cname[v->id]);
    } else {
        cg_line(w, "const float *local = %s;", local);
    }
    cg_line(w, "if (!ctx->whole_output_%s) { /* the first call allocates it (--explain counts it apart) */", E->cname[v->id]);
    cg_line(w, "    ctx->whole_output_%s = (float *)dmrt_alloc_tracked(&ctx->memory, (size_t)%lld * sizeof(float));",
            E->cname[v->id], n_whole * M);
    cg_line(w, "    if (!ctx->whole_output_%s) {", E->cname[v->id]);
    cg_line(w, "        snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory for output %s\");", g->model, v->name);
    cg_line(w, "        return NULL;");
    cg_line(w, "    }");
    cg_line(w, "}");
    cg_line(w, "float *whole = ctx->whole_output_%s;", E->cname[v->id]);
    cg_line(w, "memset(whole, 0, %lld * sizeof(float));", n_whole * M);
    char shape[256] = "", blk[256] = "";
    size_t ns = 0, nb = 0;
    for (int d = 0; d < whole->rank; d++) {
        ns += (size_t)snprintf(shape + ns, sizeof shape - ns, "%s%lld", d ? ", " : "", (long long)whole->shape[d]);
        nb += (size_t)snprintf(blk + nb, sizeof blk - nb, "%s%lld", d ? ", " : "", (long long)block->shape[d]);
    }
    int rank = whole->rank ? whole->rank : 1;
    cg_line(w, "const int64_t whole_shape[%d] = {%s}, block[%d] = {%s};", rank, whole->rank ? shape : "1", rank,
            whole->rank ? blk : "1");
    cg_line(w, "int64_t start[%d] = {0};", rank);
    for (int d = 0; d < whole->rank; d++)
        if (whole->split[d] != IR_REPLICATED) cg_line(w, "start[%d] = ctx->coord[%d] * block[%d];", d, whole->split[d], d);
    if (E->pipe_axis >= 0) cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == %d) /* the output's stage */", rank_of(E, v->stage));
    cg_line(w, "%sfor (int64_t micro = 0; micro < %lld; micro++)", E->pipe_axis >= 0 ? "    " : "", M);
    cg_line(w, "%s    dmrt_block_write(local + micro * %lld, %d, whole_shape, block, start, whole + micro * %lld);",
            E->pipe_axis >= 0 ? "    " : "", (long long)ir_numel(block), rank, n_whole);
    for (int a = 0; a < g->n_axes; a++) {
        int sums = (whole->partial >> a & 1) || a == E->pipe_axis;
        for (int d = 0; d < whole->rank; d++) sums |= whole->split[d] == a;
        if (!sums || g->axes[a].size == 1) continue;
        cg_line(w, "if (dmrt_allreduce_sum(ctx->comm[%d], whole, %lld, \"output %s, gathered over %s\") != 0) {", a,
                n_whole * M, v->name, g->axes[a].name);
        cg_line(w, "    (void)comm_failed(ctx);");
        cg_line(w, "    return NULL;");
        cg_line(w, "}");
    }
    cg_line(w, "return whole;");
}

void emit_output_accessor(emitter *E, const ir_value *v, const char *where, long long n) {
    const char *m = E->g->model, *type = ctype(v->type.dtype);
    cg_writer *w = &E->w;
    if (dm_output_gathered(E->g, v)) {
        cg_line(w, "/* Gathered from every rank's block when asked for: every rank must call it (a collective). */");
        cg_line(w, "const %s *%s_output_%s(const %s_ctx *ctx_) {", type, m, E->cname[v->id], m);
        w->indent++;
        emit_output_gather(E, v, where, n);
        w->indent--;
        cg_line(w, "}");
        cg_blank(w);
        return;
    }
    cg_line(w, "const %s *%s_output_%s(const %s_ctx *ctx) {", type, m, E->cname[v->id], m);
    w->indent++;
    if (strncmp(where, "NULL", 4) == 0) {
        cg_line(w, "(void)ctx;");
        cg_line(w, "return %s;", where);
    } else if (!E->dialect->separate_memory) {
        cg_line(w, "return %s%s;", v->type.dtype == DT_I32 ? "(const int32_t *)" : "", where);
    } else {
        char dst[160], src[200];
        snprintf(dst, sizeof dst, "ctx->host_output_%s", E->cname[v->id]);
        snprintf(src, sizeof src, "%s%s", v->type.dtype == DT_I32 ? "(const int32_t *)" : "", where);
        const char *saved = E->on_fail;
        E->on_fail = "return NULL;";
        cg_copy_elems(E, dst, src, n, type, CG_DEVICE_TO_HOST);
        E->on_fail = saved;
        cg_line(w, "return ctx->host_output_%s;", E->cname[v->id]);
    }
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_scheduled_api(emitter *E) {
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
                    rank_of(E, V(E, g->loss)->stage), g->microbatches);
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
            if (dm_output_gathered(E->g, V(E, o))) continue; /* gathered when asked for */
            long long n = (long long)(g->microbatches * ir_numel(T(E, o)));
            char out[128], callee[96];
            snprintf(out, sizeof out, "ctx->output_%s", E->cname[o]);
            cg_line(w, "if (ctx->coord[PIPELINE_AXIS] != %d) {", rank_of(E, V(E, o)->stage));
            w->indent++;
            cg_zero_elems(E, out, n, "float");
            w->indent--;
            cg_line(w, "}");
            cg_line(w, "if (%sctx->comm[PIPELINE_AXIS], (float *)ctx->output_%s, %lld, \"output %s, from its stage\") != 0)",
                    cg_comm_callee(E, "allreduce_sum", callee, sizeof callee), E->cname[o], n, V(E, o)->name);
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
    emit_quant_ready_check(E);
    cg_line(w, "int status;");
    emit_upload(E);
    emit_stage_dispatch(E, "infer", "ctx, batch");
    cg_line(w, "if (status != DMRT_OK) return status;");
    cg_line(w, "return finish_forward(ctx, loss);");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (open_train_step(E)) {
        cg_line(w, "ctx->error[0] = 0;");
        cg_line(w, "int status;");
        emit_upload(E);
        if (E->dropout) cg_line(w, "ctx->training = 1; /* dropout draws its masks */");
        emit_stage_dispatch(E, "train", "ctx, batch");
        if (E->dropout) cg_line(w, "ctx->training = 0;");
        cg_line(w, "if (status == DMRT_OK) status = finish_forward(ctx, loss);");
        cg_line(w, "if (status != DMRT_OK) return status;");
        if (g->optimizer.kind != OPTIM_NONE && !emits_2bw(E)) { /* 2bw: in the stages' steps */
            cg_line(w, "ctx->step++;");
            emit_stage_dispatch(E, "update", "ctx, batch");
        } else if (emits_2bw(E) && dm_runs_pipedream(g)) {
            cg_line(w, "ctx->step++; /* pipedream: steps (batches); the updates, one per backward, are ctx->updates */");
        }
        cg_line(w, "return status;");
    }
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        char where[128];
        snprintf(where, sizeof where, "ctx->output_%s", E->cname[v->id]);
        emit_output_accessor(E, v, where, (long long)(g->microbatches * ir_numel(T(E, v->id))));
    }
    emit_2bw_api(E);
}

static void emit_serial_forward_train(emitter *E);

/* Forward, train_step and the outputs of a program run in one go (no micro-batches). */
void emit_serial_api(emitter *E) {
    const ir_graph *g = E->g;
    if (emits_step_end(E)) {
        emit_finish_step(E);
        emit_serial_api_step_end(E, open_train_step);
    } else {
        emit_serial_forward_train(E);
    }
    for (int i = 0; i < g->n_outputs; i++) {
        const ir_value *v = V(E, g->outputs[i]);
        char where[128];
        cg_storage_expr(E, v->id, where, sizeof where);
        if (E->plan->region[v->id] == REGION_INPUT) snprintf(where, sizeof where, "NULL /* an input: the caller has it */");
        emit_output_accessor(E, v, where, (long long)ir_numel(T(E, v->id)));
    }
}

/* Forward and train_step of a serial program whose phases check the fault record. */
static void emit_serial_forward_train(emitter *E) {
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    emit_open_serial_forward(E);
    if (g->loss >= 0) {
        char where[128];
        cg_storage_expr(E, g->loss, where, sizeof where);
        cg_line(w, "if (status != DMRT_OK || !loss) return status;");
        cg_line(w, "/* %s */", E->cname[g->loss]);
        cg_copy_elems(E, "loss", where, 1, "float", CG_DEVICE_TO_HOST);
    } else {
        cg_line(w, "if (loss) *loss = 0.0f; /* the model declares no loss */");
    }
    cg_line(w, "return status;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    if (open_train_step(E)) {
        if (E->dropout) cg_line(w, "ctx->training = 1; /* dropout draws its masks */");
        cg_line(w, "int status = %s_forward(ctx, batch, loss);", m);
        if (E->dropout) cg_line(w, "ctx->training = 0;");
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
}
