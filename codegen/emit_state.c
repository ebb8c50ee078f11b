/* emit_state.c: what a checkpoint holds beyond the parameters: the optimizer state, as whole
 * tensors named after their parameter ("fc1.weight.exp_avg", shaped like it), moved between
 * the whole tensor and wherever this program keeps it (a rank's block, one pipeline stage,
 * ZeRO's shares over the data axis), and the update counter. runtime/checkpoint.c writes and
 * reads the files through the descriptor's state_gather, state_scatter, step and set_step.
 * Whole tensors are what make a checkpoint of one mesh load on any other. A dialect with a
 * separate memory (CUDA) keeps the state there: the moves copy through host memory, as the
 * parameters' do (emit_params.c). */
#include <stdio.h>
#include <stdlib.h>

#include "emitter.h"

/* The optimizer's state values in checkpoint order: by parameter, then as the update op
 * takes them (exp_avg before exp_avg_sq, --prune's mask last). Returns how many; ids has
 * room for 3 per parameter (AdamW's two or SGD's momentum, and a mask). */
static int state_values(const emitter *E, int *ids) {
    const ir_graph *g = E->g;
    int *update_of = malloc(((size_t)g->n_params + 1) * sizeof(int)); /* (n_params) its first update op, or -1 */
    if (!update_of) abort();
    for (int p = 0; p < g->n_params; p++) update_of[p] = -1;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *u = g->values[i];
        if ((u->op == OP_SGD_UPDATE || u->op == OP_ADAMW_UPDATE) && u->param_index >= 0 &&
            u->param_index < g->n_params && update_of[u->param_index] < 0)
            update_of[u->param_index] = i;
    }
    int n = 0;
    for (int p = 0; p < g->n_params; p++)
        for (int k = 2; update_of[p] >= 0 && k < g->values[update_of[p]]->n_operands; k++)
            ids[n++] = g->values[update_of[p]]->operands[k];
    free(update_of);
    return n;
}

/* Why this program cannot write checkpoints, or NULL when it can. */
static const char *checkpoints_unsupported(const emitter *E) {
    if (!E->dialect->can.checkpoints) return "this target's generated code does not read its optimizer state into checkpoints yet";
    return NULL;
}
static int checkpoints_supported(const emitter *E) { return checkpoints_unsupported(E) == NULL; }

void emit_state_declarations(emitter *E) {
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    cg_line(w, "/* Checkpoints: the parameters, the optimizer's state and the updates done, in one");
    cg_line(w, " * safetensors file written atomically; loading checks every tensor before it changes");
    cg_line(w, " * anything. Files hold whole tensors, so a checkpoint of any mesh of this model loads.%s%s%s */",
            E->partitioned ? "\n * Every rank must call them; world rank 0 writes" : "",
            checkpoints_supported(E) ? "" : "\n * Not this program (both return DMRT_ERR_ARG): ",
            checkpoints_supported(E) ? "" : checkpoints_unsupported(E));
    if (checkpoints_supported(E) && emits_2bw(E))
        cg_line(w, "/* Saving one first drains the pipeline (%s_drain): a file holds neither owed backwards nor a\n"
                   " * second weight version, and the run goes on as one loaded from it would. */", m);
    if (checkpoints_supported(E) && cg_compress_state_count(E))
        cg_line(w, "/* --compress's error feedback is each data rank's: files hold a row per data rank; loaded on another\n"
                   " * number of them, each rank starts from the rows' sum over its count (docs/trainer.md). */");
    cg_line(w, "int %s_save_checkpoint(%s_ctx *ctx, const char *path);", m, m);
    cg_line(w, "int %s_load_checkpoint(%s_ctx *ctx, const char *path);", m, m);
    cg_line(w, "/* Optimizer updates done: train_step counts them, a loaded checkpoint sets them. */");
    cg_line(w, "int64_t %s_step(const %s_ctx *ctx);", m, m);
    cg_blank(w);
}

/* The descriptors of the n optimizer states and the compression states after them, and
 * each one's layout where there are compression states. */
static void emit_state_descs(emitter *E, const int *ids, int n) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int n_compress = cg_compress_state_count(E);
    cg_line(w, "/* The optimizer's state as checkpoints hold it: whole, shaped like its parameter%s. */",
            n_compress ? "; then gradient compression's (gather_compress_state)" : "");
    cg_line(w, "static const dmrt_tensor_desc state_descs[%d] = {", n + n_compress);
    w->indent++;
    for (int i = 0; i < n; i++) emit_tensor_desc(E, V(E, g->params[V(E, ids[i])->param_index]), V(E, ids[i])->name);
    emit_compress_state_descs(E);
    w->indent--;
    cg_line(w, "};");
    if (!n_compress) return;
    cg_line(w, "static const signed char state_layouts[%d] = {", n + n_compress);
    if (n) cg_line(w, "    /* the optimizer's %d */", n);
    for (int i = 0; i < n; i += 6) {
        char row[160] = "";
        size_t len = 0;
        for (int k = i; k < n && k < i + 6; k++) {
            int c = snprintf(row + len, sizeof row - len, "%sDMRT_STATE_WHOLE,", k > i ? " " : "");
            if (c > 0) len += (size_t)c;
        }
        cg_line(w, "    %s", row);
    }
    emit_compress_state_layouts(E);
    cg_line(w, "};");
}

/* The tables of the n optimizer states: each one's parameter, stage and place. */
static void emit_state_tables(emitter *E, const int *ids, int n) {
    const ir_graph *g = E->g;
    cg_writer *w = &E->w;
    int zero = E->zero->n_buckets > 0;
    cg_line(w, "/* Where this program keeps state i: {its parameter, the pipeline coordinate of the ranks holding");
    cg_line(w, " * it, its offset in ctx->state on those ranks%s}. */", zero ? " (-1: in ZeRO's shares, zero_states)" : "");
    cg_line(w, "static const int64_t state_places[%d][3] = {", n);
    for (int i = 0; i < n; i++) {
        const ir_value *s = V(E, ids[i]);
        int p = s->param_index, staged = E->plan->stages > 1, rank = staged ? rank_of(E, s->stage) : 0;
        long long at = zero_bucket_of(E, p) ? -1
                       : (long long)(staged ? dm_offset_on_rank(E->plan, g, s->id, rank) : dm_offset_on(E->plan, g, s->id, -1));
        cg_line(w, "    {%d, %d, %lld}, /* %s */", p, rank, at, s->name);
    }
    cg_line(w, "};");
    if (!E->partitioned) return;
    cg_line(w, "/* The mesh axis splitting each dim of each state tensor (-1: whole on every rank). */");
    cg_line(w, "static const int8_t state_split[%d][%d] = {", n, IR_MAX_RANK);
    for (int i = 0; i < n; i++) {
        const ir_type *t = &V(E, ids[i])->type;
        char row[128] = "";
        size_t len = 0;
        for (int d = 0; d < IR_MAX_RANK; d++) {
            int k = snprintf(row + len, sizeof row - len, "%s%d", d ? ", " : "", d < t->rank ? t->split[d] : -1);
            if (k > 0) len += (size_t)k;
        }
        cg_line(w, "    {%s}, /* %s */", row, V(E, ids[i])->name);
    }
    cg_line(w, "};");
    if (!zero) return;
    cg_line(w, "/* ZeRO: state i in shares over an axis: {axis, share, this rank's share in ctx->state, the");
    cg_line(w, " * parameter's place in its bucket's range, the range}; axis -1: not in shares. */");
    cg_line(w, "static const int64_t zero_states[%d][5] = {", n);
    for (int i = 0; i < n; i++) {
        const ir_value *s = V(E, ids[i]);
        const dm_zero_bucket *b = zero_bucket_of(E, s->param_index);
        if (!b) {
            cg_line(w, "    {-1, 0, 0, 0, 0}, /* %s */", s->name);
            continue;
        }
        /* the update op takes its state tensors in order: the j-th is at state_at + j * stride */
        const ir_value *u = V(E, E->zero->update_of[s->param_index]);
        int j = 0;
        while (j + 2 < u->n_operands && u->operands[j + 2] != s->id) j++;
        cg_line(w, "    {%d, %lld, %lld, %lld, %lld}, /* %s */", b->axis, (long long)b->share,
                (long long)(b->state_at + j * b->state_stride), (long long)E->zero->range_at[s->param_index],
                (long long)b->span, s->name);
    }
    cg_line(w, "};");
}

/* gather_state and scatter_state of an SPMD program, as gather_param and scatter_param. */
static void emit_spmd_state_moves(emitter *E) {
    cg_writer *w = &E->w;
    int zero = E->zero->n_buckets > 0, pipe = E->pipe_axis >= 0;
    cg_line(w, "/* State i, whole, on every rank: the ranks holding it write their blocks into zeros and the");
    cg_line(w, " * blocks are summed over the axes that split it (x + 0 is exact). Every rank must call it. */");
    cg_line(w, "static int gather_state(struct_ctx *ctx, int i, float *whole) {");
    w->indent++;
    cg_line(w, "const int p = (int)state_places[i][0];");
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, state_split[i], start, block);");
    cg_line(w, "memset(whole, 0, (size_t)state_descs[i].numel * sizeof(float));");
    if (pipe) {
        cg_line(w, "if (ctx->coord[PIPELINE_AXIS] == state_places[i][1]) {");
        w->indent++;
    }
    cg_line(w, "const float *shard = state_places[i][2] >= 0 ? ctx->state + state_places[i][2] : NULL;");
    if (zero) {
        cg_line(w, "float *range = NULL;");
        if (E->dialect->separate_memory) cg_line(w, "int on_host = 0; /* shard is in host memory (a range gathered there) */");
        cg_line(w, "if (zero_states[i][0] >= 0) {");
        w->indent++;
        emit_range_gather(E, "zero_states[i]", "ctx->state + z[2]", "z[4]", "z[3]", "state_descs[i].name");
        w->indent--;
        cg_line(w, "}");
    }
    cg_shard_into_block(E, zero && E->dialect->separate_memory ? "on_host" : NULL);
    if (zero) cg_line(w, "dmrt_free(range);");
    if (pipe) {
        w->indent--;
        cg_line(w, "}");
    }
    cg_line(w, "for (int axis = 0; axis < %d; axis++) {", E->g->n_axes);
    cg_line(w, "    int splits = %s;", pipe ? "axis == PIPELINE_AXIS" : "0");
    cg_line(w, "    for (int d = 0; d < param_shapes[p][0]; d++) splits |= state_split[i][d] == axis;");
    cg_line(w, "    if (splits && dmrt_allreduce_sum(ctx->comm[axis], whole, state_descs[i].numel, state_descs[i].name) != 0)");
    cg_line(w, "        return comm_failed(ctx);");
    cg_line(w, "}");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* State i's block of the whole tensor into this rank's storage (local, no communication). */");
    cg_line(w, "static int scatter_state(struct_ctx *ctx, int i, const float *whole) {");
    w->indent++;
    cg_line(w, "const int p = (int)state_places[i][0];");
    cg_line(w, "int64_t start[DMRT_MAX_RANK], block[DMRT_MAX_RANK];");
    cg_line(w, "rank_block(ctx, p, state_split[i], start, block);");
    if (pipe) cg_line(w, "if (ctx->coord[PIPELINE_AXIS] != state_places[i][1]) return DMRT_OK; /* another stage's */");
    if (zero) {
        cg_line(w, "if (zero_states[i][0] >= 0) {");
        w->indent++;
        emit_share_scatter(E, "zero_states[i]", "ctx->state");
        w->indent--;
        cg_line(w, "}");
    }
    cg_block_into_shard(E, "ctx->state + state_places[i][2]");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The serial program keeps every state tensor whole: the moves are copies. */
static void emit_serial_state_moves(emitter *E) {
    cg_writer *w = &E->w;
    const char *bytes = "(size_t)state_descs[i].numel * sizeof(float)";
    cg_line(w, "/* State i, whole (the serial program holds it so)%s. */", E->dialect->separate_memory ? ", copied from or into its memory" : "");
    cg_line(w, "static int gather_state(struct_ctx *ctx, int i, float *whole) {");
    w->indent++;
    if (E->dialect->separate_memory)
        E->dialect->copy(w, "whole", "ctx->state + state_places[i][2]", bytes, CG_DEVICE_TO_HOST, E->on_fail);
    else cg_line(w, "memcpy(whole, ctx->state + state_places[i][2], %s);", bytes);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "static int scatter_state(struct_ctx *ctx, int i, const float *whole) {");
    w->indent++;
    if (E->dialect->separate_memory)
        E->dialect->copy(w, "ctx->state + state_places[i][2]", "whole", bytes, CG_HOST_TO_DEVICE, E->on_fail);
    else cg_line(w, "memcpy(ctx->state + state_places[i][2], whole, %s);", bytes);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The tables and moves (host targets), the checkpoint API and the descriptor's wrappers. */
void emit_state_support(emitter *E) {
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    int *ids = malloc(sizeof(int) * (size_t)(3 * E->g->n_params + 1));
    if (!ids) {
        fprintf(stderr, "dmc: out of memory\n");
        exit(1);
    }
    int n_optimizer = checkpoints_supported(E) ? state_values(E, ids) : 0;
    int n_compress = checkpoints_supported(E) ? cg_compress_state_count(E) : 0;
    E->n_states = n_optimizer + n_compress;
    if (E->n_states) emit_state_descs(E, ids, n_optimizer);
    if (n_optimizer && emits_param_servers(E)) {
        emit_ps_state_moves(E, ids, n_optimizer);
    } else if (n_optimizer) {
        emit_state_tables(E, ids, n_optimizer);
        if (E->partitioned) emit_spmd_state_moves(E);
        else emit_serial_state_moves(E);
    }
    if (n_compress) emit_compress_state_moves(E, n_optimizer); /* (a data axis: partitioned) */
    if (E->n_states && !n_compress) {
        cg_line(w, "static int model_state_gather(void *ctx, int i, float *whole) { return gather_state((struct_ctx *)ctx, i, whole); }");
        cg_line(w, "static int model_state_scatter(void *ctx, int i, const float *whole) {");
        cg_line(w, "    return scatter_state((struct_ctx *)ctx, i, whole);");
        cg_line(w, "}");
    } else if (n_compress) {
        const char *opt_gather = n_optimizer ? "gather_state((struct_ctx *)ctx, i, whole)" : "DMRT_ERR_ARG";
        const char *opt_scatter = n_optimizer ? "scatter_state((struct_ctx *)ctx, i, whole)" : "DMRT_ERR_ARG";
        cg_line(w, "static int model_state_gather(void *ctx, int i, float *whole) {");
        cg_line(w, "    return i < %d ? %s : gather_compress_state((struct_ctx *)ctx, i - %d, whole);", n_optimizer, opt_gather, n_optimizer);
        cg_line(w, "}");
        cg_line(w, "static int model_state_scatter(void *ctx, int i, const float *whole) {");
        cg_line(w, "    return i < %d ? %s : scatter_compress_state((struct_ctx *)ctx, i - %d, whole);", n_optimizer, opt_scatter, n_optimizer);
        cg_line(w, "}");
    }
    free(ids);
    cg_line(w, "static int64_t model_step(void *ctx) { return ((struct_ctx *)ctx)->step; }");
    cg_line(w, "static int model_set_step(void *ctx, int64_t step) {");
    cg_line(w, "    if (step < 0) return DMRT_ERR_ARG;");
    cg_line(w, "    ((struct_ctx *)ctx)->step = step;");
    if (emits_2bw(E)) cg_line(w, "    restart_stream((struct_ctx *)ctx); /* a checkpoint's state: the pipeline drained */");
    cg_line(w, "    return DMRT_OK;");
    cg_line(w, "}");
    cg_line(w, "int64_t %s_step(const %s_ctx *ctx) { return ctx->step; }", m, m);
    cg_blank(w);
    emit_ps_checkpoint_hooks(E);
    for (int save = 1; save >= 0; save--) {
        cg_line(w, "int %s_%s_checkpoint(%s_ctx *ctx, const char *path) {", m, save ? "save" : "load", m);
        w->indent++;
        cg_line(w, "ctx->error[0] = 0;");
        if (!checkpoints_supported(E)) {
            cg_line(w, "(void)path;");
            cg_line(w, "snprintf(ctx->error, sizeof ctx->error, \"%%s\", \"model '%s' cannot write or read checkpoints: %s\");", m,
                    checkpoints_unsupported(E));
            cg_line(w, "return DMRT_ERR_ARG;");
        } else if (save) {
            cg_line(w, "return dmrt_save_checkpoint(&%s_model, ctx, path, 0, NULL, NULL, ctx->error, sizeof ctx->error) ? DMRT_ERR_FILE : DMRT_OK;", m);
        } else {
            cg_line(w, "return dmrt_load_checkpoint(&%s_model, ctx, path, NULL, ctx->error, sizeof ctx->error) ? DMRT_ERR_FILE : DMRT_OK;", m);
        }
        w->indent--;
        cg_line(w, "}");
    }
    cg_blank(w);
}

void emit_state_descriptor(emitter *E) {
    cg_writer *w = &E->w;
    int n = E->n_states;
    cg_line(w, ".checkpoints = %d,", checkpoints_supported(E));
    if (checkpoints_supported(E)) cg_line(w, ".checkpoints_unsupported = NULL,");
    else cg_line(w, ".checkpoints_unsupported = \"%s\",", checkpoints_unsupported(E));
    cg_line(w, ".n_states = %d,", n);
    cg_line(w, ".states = %s,", n ? "state_descs" : "NULL");
    cg_line(w, ".state_layouts = %s,", n && cg_compress_state_count(E) ? "state_layouts" : "NULL");
    cg_line(w, ".state_gather = %s,", n ? "model_state_gather" : "NULL");
    cg_line(w, ".state_scatter = %s,", n ? "model_state_scatter" : "NULL");
    cg_line(w, ".step = model_step,");
    cg_line(w, ".set_step = model_set_step,");
    cg_line(w, ".checkpoint_drains = %d,", checkpoints_supported(E) && emits_2bw(E));
}
