/* emit_ps.c: parameter servers (--param-servers, runtime/comm/dmrt_ps.h). A worker's update
 * phase puts each gradient in its place (the buckets' copies, without their allreduce)
 * and, in place of the updates, pushes the gradients to the servers and pulls the
 * parameters back. The servers run the optimizer's update as this file writes it, from the
 * same dialect hook as a model's own update, on a shard's elements laid end to end: one
 * rule wherever it runs, so that the synchronous servers' parameters are the allreduce's,
 * bit for bit. */
#include <stdio.h>

#include "emitter.h"

int emits_param_servers(const emitter *E) { return E->g->param_servers.servers > 0 && emits_update(E); }

/* Whether the program updates parameter p: it has an update op (passes/optimizer.c gives
 * none to a parameter the loss does not reach, which keeps its values, undecayed, as in
 * the serial program and allreduce data parallelism). The servers hold and update only
 * these; the workers keep the others as they have them. */
static int ps_updated(const emitter *E, int p) {
    for (int i = 0; i < E->g->n_values; i++)
        if (ir_op_info_of(V(E, i)->op)->cls == OPC_UPDATE && V(E, i)->param_index == p) return 1;
    return 0;
}

/* The optimizer state floats per parameter float: those of the first update op. */
int cg_ps_states(const emitter *E) {
    for (int i = 0; i < E->g->n_values; i++)
        if (ir_op_info_of(V(E, i)->op)->cls == OPC_UPDATE) return V(E, i)->n_operands - 2;
    return 0;
}

/* The floats of the parameters the servers hold, end to end. */
static int64_t ps_total(const emitter *E) {
    int64_t total = 0;
    for (int p = 0; p < E->g->n_params; p++)
        if (ps_updated(E, p)) total += ir_numel(T(E, E->g->params[p]));
    return total;
}

int64_t cg_ps_state_at(const emitter *E, int p, int k) {
    int64_t at = k * ps_total(E);
    for (int q = 0; q < p; q++)
        if (ps_updated(E, q)) at += ir_numel(T(E, E->g->params[q]));
    return at;
}

static void ps_call_failed(emitter *E, const char *call) {
    cg_line(&E->w, "if (%s != %s)", call, E->dialect->separate_memory ? "DMRT_OK" : "0");
    cg_line(&E->w, "    return comm_failed(ctx);");
}

/* ps_start (worker 0 starts the servers, once) and ps_snapshot (a checkpoint's view of them). */
static void emit_ps_start_and_snapshot(emitter *E, int states) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    int gpu = E->dialect->separate_memory;
    if (states) {
        cg_line(w, "/* ctx->ps_state allocated (host memory, %d x %lld floats), where it is not yet */", states,
                (long long)ps_total(E));
        cg_line(w, "static int ps_state_held(struct_ctx *ctx) {");
        cg_line(w, "    if (ctx->ps_state || (ctx->ps_state = (float *)dmrt_alloc((size_t)%lld * sizeof(float)))) return DMRT_OK;",
                (long long)(states * ps_total(E)));
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: out of memory for the parameter servers' state\");", m);
        cg_line(w, "    return DMRT_ERR_NOMEM;");
        cg_line(w, "}");
        cg_blank(w);
    }
    cg_line(w, "/* Before any other message to the servers, once: worker 0 sends them their shards of the");
    cg_line(w, " * parameters and of a loaded checkpoint's optimizer state and updates (zeros and 0 without one). */");
    cg_line(w, "static int ps_start(struct_ctx *ctx) {");
    w->indent++;
    cg_line(w, "if (ctx->ps_started) return DMRT_OK;");
    cg_line(w, "if (ctx->ps_finished) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s_drain told the parameter servers this worker is done: no step or checkpoint after it\");", m);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    cg_line(w, "ctx->ps_started = 1;");
    ps_call_failed(E, gpu ? "dmrt_gpu_ps_start(ctx->gpu, ctx->rank, &ps_layout, ctx->params, ctx->ps_state, ctx->ps_updates)"
                          : "dmrt_ps_start(ctx->rank, &ps_layout, ctx->params, ctx->ps_state, ctx->ps_updates)");
    cg_line(w, "dmrt_free(ctx->ps_state); /* the servers hold it now */");
    cg_line(w, "ctx->ps_state = NULL;");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* A checkpoint's view of the servers after this step (every worker asks after the same one):");
    cg_line(w, " * their parameters into ctx->params (as a pull), their optimizer state into ctx->ps_state and");
    cg_line(w, " * their updates into ctx->ps_updates. Once a step: the file's tensors are read from it. */");
    cg_line(w, "static int ps_snapshot(struct_ctx *ctx) {");
    w->indent++;
    cg_line(w, "if (ctx->ps_snapshot_fresh) return DMRT_OK;");
    cg_line(w, "if (ctx->ps_finished) { /* the servers have stopped */");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s_drain told the parameter servers this worker is done: write checkpoints before it\");", m);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    cg_line(w, "int status = ps_start(ctx);");
    cg_line(w, "if (status != DMRT_OK) return status;");
    if (states) cg_line(w, "if ((status = ps_state_held(ctx)) != DMRT_OK) return status;");
    ps_call_failed(E, gpu ? "dmrt_gpu_ps_snapshot(ctx->gpu, ctx->rank, &ps_layout, ctx->step, ctx->params, ctx->ps_state, &ctx->ps_updates)"
                          : "dmrt_ps_snapshot(ctx->rank, &ps_layout, ctx->step, ctx->params, ctx->ps_state, &ctx->ps_updates)");
    cg_line(w, "ctx->ps_snapshot_fresh = 1;");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* In the source's head: the segments, the update the servers run, the layout. */
void emit_ps_tables(emitter *E) {
    if (!emits_param_servers(E)) return;
    const ir_graph *g = E->g;
    const ir_param_servers *ps = &g->param_servers;
    cg_writer *w = &E->w;
    cg_line(w, "#include \"dmrt_ps.h\"");
    cg_blank(w);
    int segments = 0;
    for (int p = 0; p < g->n_params; p++) segments += ps_updated(E, p);
    cg_line(w, "/* --param-servers %d%s: each parameter the program updates, where a worker keeps it and", ps->servers,
            ps->staleness >= 0 ? " --ps-staleness" : "");
    cg_line(w, " * its gradient; the servers hold them laid end to end, in shards (dmrt_ps.h). A parameter");
    cg_line(w, " * without an update (the loss does not reach it) stays as the workers have it. */");
    cg_line(w, "static const dmrt_ps_segment ps_segments[%d] = {", segments);
    for (int p = 0; p < g->n_params; p++)
        if (ps_updated(E, p))
            cg_line(w, "    {%lld, %lld, %lld}, /* %s */", (long long)dm_offset_on(E->plan, g, g->params[p], -1),
                    (long long)dm_offset_on(E->plan, g, g->grads[p], -1), (long long)ir_numel(T(E, g->params[p])),
                    V(E, g->params[p])->name);
        else
            cg_line(w, "    /* %s: not updated (no gradient reaches it), not on the servers */", V(E, g->params[p])->name);
    cg_line(w, "};");
    cg_blank(w);
    int states = cg_ps_states(E);
    char line[160];
    cg_source_line(E, g->optimizer.loc.line, line, sizeof line);
    cg_line(w, "/* A server's update of n elements of its shard: the optimizer's, as run_update's.");
    cg_line(w, " * %s:%d: %s */", E->source_path, g->optimizer.loc.line, line);
    cg_line(w, "static void ps_update(const dmrt_ps_step *ctx, float *param, const float *grad, float *const *state, int64_t n) {");
    w->indent++;
    if (!states) cg_line(w, "(void)state;");
    /* the shard's own update count: a worker's step skipped by fp16's scaler pushes nothing */
    cg_update k = {.opt = &g->optimizer, .count = "n", .param = "param", .grad = "grad", .updates = "ctx->step",
                   .state0 = states > 0 ? "state[0]" : NULL, .state1 = states > 1 ? "state[1]" : NULL};
    /* the servers hold their shards in host memory whatever the target: the C dialect's loops */
    const cg_dialect *host = E->dialect->separate_memory ? &cg_dialect_c : E->dialect;
    if (g->optimizer.kind == OPTIM_SGD) host->sgd(w, &k);
    else host->adamw(w, &k);
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "static const dmrt_ps_layout ps_layout = {");
    cg_line(w, "    .workers = %lld, .servers = %d, .staleness = %d, /* %s */", (long long)ir_mesh_ranks(g), ps->servers,
            ps->staleness, ps->staleness < 0 ? "synchronous" : "asynchronous, at most this many steps apart");
    cg_line(w, "    .n_segments = %d, .segments = ps_segments, .states = %d, .update = ps_update,", segments, states);
    cg_line(w, "};");
    cg_blank(w);
    emit_ps_start_and_snapshot(E, states);
}

void emit_ps_fields(emitter *E) {
    if (!emits_param_servers(E)) return;
    cg_line(&E->w, "int ps_started; /* worker 0 sent the parameter servers their shards (dmrt_ps_start) */");
    cg_line(&E->w, "int ps_finished; /* this worker told the servers it is done (drain): no step after it */");
    cg_line(&E->w, "float *ps_state; /* (%d x %lld) the servers' optimizer state, as dmrt_ps_start lays it out: a loaded", cg_ps_states(E),
            (long long)ps_total(E));
    cg_line(&E->w, "                  * checkpoint's to start them from, or a snapshot's to write one; NULL: none */");
    cg_line(&E->w, "int64_t ps_updates; /* the servers' updates: a loaded checkpoint's, or a snapshot's */");
    cg_line(&E->w, "int ps_snapshot_fresh; /* ps_state and ps_updates are the servers' after this worker's last step */");
}

/* The exchange of a worker's step; grads: "ctx->grads", or "NULL" for a step the loss
 * scaler skipped (asynchronous servers). */
static void ps_exchange_call(emitter *E, const char *grads) {
    cg_writer *w = &E->w;
    cg_line(w, "if (ctx->ps_finished) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s_drain told the parameter servers this worker is done: no step after it\");",
            E->g->model);
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    cg_line(w, "int ps_status = ps_start(ctx);");
    cg_line(w, "if (ps_status != DMRT_OK) return ps_status;");
    char call[256];
    if (E->dialect->separate_memory) /* staged through host memory */
        snprintf(call, sizeof call, "dmrt_gpu_ps_exchange(ctx->gpu, ctx->rank, &ps_layout, %s, ctx->params, ctx->step, ctx->lr)", grads);
    else snprintf(call, sizeof call, "dmrt_ps_exchange(ctx->rank, &ps_layout, %s, ctx->params, ctx->step, ctx->lr)", grads);
    ps_call_failed(E, call);
    cg_line(w, "ctx->ps_snapshot_fresh = 0; /* a snapshot's state is of before this step */");
    cg_line(w, "dmrt_free(ctx->ps_state);");
    cg_line(w, "ctx->ps_state = NULL;");
}

/* At the end of a worker's update phase. */
void emit_ps_exchange(emitter *E) {
    if (!emits_param_servers(E)) return;
    cg_writer *w = &E->w;
    cg_blank(w);
    cg_line(w, "/* the parameter servers (world ranks %lld..%lld) update the parameters: this worker's gradients",
            (long long)ir_mesh_ranks(E->g), (long long)ir_mesh_ranks(E->g) + E->g->param_servers.servers - 1);
    cg_line(w, " * go to them, their shards of the parameters come back */");
    ps_exchange_call(E, "ctx->grads");
}

int emits_async_param_servers(const emitter *E) { return emits_param_servers(E) && E->g->param_servers.staleness >= 0; }

/* In the loss scaler's skip of a step, asynchronous servers: the step goes to the servers
 * without gradients (they count it, apply nothing) and the parameters come back. */
void emit_ps_skipped_exchange(emitter *E) {
    if (!emits_async_param_servers(E)) return;
    E->w.indent++;
    cg_line(&E->w, "/* to the servers as a step without gradients (counted for the bound, nothing applied) */");
    ps_exchange_call(E, "NULL");
    E->w.indent--;
}

/* In destroy: the servers stop once every worker is done. */
void emit_ps_finish(emitter *E) {
    if (!emits_param_servers(E)) return;
    cg_line(&E->w, "/* the servers stop once every worker says it is done (and began: a worker 0 that never");
    cg_line(&E->w, " * stepped starts them first) */");
    cg_line(&E->w, "if (ctx->rank && ctx->params && !ctx->ps_finished && ps_start(ctx) == DMRT_OK)");
    if (E->dialect->separate_memory) cg_line(&E->w, "    (void)dmrt_gpu_ps_finish(ctx->gpu, ctx->rank, &ps_layout);");
    else cg_line(&E->w, "    (void)dmrt_ps_finish(ctx->rank, &ps_layout);");
    cg_line(&E->w, "dmrt_free(ctx->ps_state);");
}

void emit_ps_declaration(emitter *E) {
    if (!emits_param_servers(E)) return;
    const char *m = E->g->model;
    cg_line(&E->w, "#include \"dmrt_ps.h\"");
    cg_line(&E->w, "/* A parameter server's part of the run, on world ranks %lld..%lld (the workers, on the mesh,",
            (long long)ir_mesh_ranks(E->g), (long long)ir_mesh_ranks(E->g) + E->g->param_servers.servers - 1);
    cg_line(&E->w, " * call %s_create_rank): serves its shard until every worker is done (%s_drain, or its", m, m);
    cg_line(&E->w, " * context destroyed).");
    cg_line(&E->w, " * stats: what it did. DMRT_OK, or DMRT_ERR_COMM with the message in err. */");
    cg_line(&E->w, "int %s_serve(dmrt_rank *rank, dmrt_ps_stats *stats, char *err, size_t errlen);", m);
    cg_line(&E->w, "/* A worker's end of training: tells the servers it is done and, once every worker is,");
    cg_line(&E->w, " * pulls their final parameters, so that what is saved or evaluated holds every worker's");
    cg_line(&E->w, " * pushes (asynchronous servers apply the others' last ones after this worker's last");
    cg_line(&E->w, " * pull). Every worker must call it; no step after it. DMRT_OK, or DMRT_ERR_COMM. */");
    cg_line(&E->w, "int %s_drain(%s_ctx *ctx);", m, m);
}

void emit_ps_api(emitter *E) {
    if (!emits_param_servers(E)) return;
    const ir_graph *g = E->g;
    const char *m = g->model;
    cg_writer *w = &E->w;
    cg_line(w, "int %s_serve(dmrt_rank *rank, dmrt_ps_stats *stats, char *err, size_t errlen) {", m);
    w->indent++;
    cg_line(w, "if (dmrt_mesh_init_outside(rank, %d, mesh_axis_names, mesh_axis_sizes, %d, err, errlen) != 0) return DMRT_ERR_COMM;",
            g->n_axes, g->param_servers.servers);
    cg_line(w, "if (dmrt_ps_serve(rank, &ps_layout, dmrt_threads_per_rank(dmrt_rank_local_count(rank)), stats) != 0) {");
    cg_line(w, "    snprintf(err, errlen, \"%%s\", dmrt_rank_error(rank));");
    cg_line(w, "    return DMRT_ERR_COMM;");
    cg_line(w, "}");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "int %s_drain(%s_ctx *ctx) {", m, m);
    w->indent++;
    cg_line(w, "ctx->error[0] = 0;");
    cg_line(w, "if (ctx->ps_finished) return DMRT_OK;");
    cg_line(w, "int status = ps_start(ctx); /* a worker 0 that never stepped starts the servers first */");
    cg_line(w, "ctx->ps_finished = 1; /* destroy does not say it again, even when this fails */");
    cg_line(w, "if (status != DMRT_OK) return status;");
    ps_call_failed(E, E->dialect->separate_memory ? "dmrt_gpu_ps_finish_pull(ctx->gpu, ctx->rank, &ps_layout, ctx->params)"
                                                  : "dmrt_ps_finish_pull(ctx->rank, &ps_layout, ctx->params)");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "static int model_drain(void *ctx) { return %s_drain((struct_ctx *)ctx); }", m);
    cg_blank(w);
    cg_line(w, "static int model_serve(dmrt_rank *rank, dmrt_ps_stats *stats, char *err, size_t errlen) {");
    cg_line(w, "    return %s_serve(rank, stats, err, errlen);", m);
    cg_line(w, "}");
    cg_blank(w);
}

void emit_ps_descriptor(emitter *E) {
    int on = emits_param_servers(E);
    cg_line(&E->w, ".param_servers = %d,", on ? E->g->param_servers.servers : 0);
    cg_line(&E->w, ".serve = %s,", on ? "model_serve" : "NULL");
}

/* The descriptor's hooks for checkpoints (dmrt_model's last fields). */
void emit_ps_checkpoint_descriptor(emitter *E) {
    int on = emits_param_servers(E);
    cg_line(&E->w, ".ps_snapshot = %s,", on ? "model_ps_snapshot" : "NULL");
    cg_line(&E->w, ".ps_updates = %s,", on ? "model_ps_updates" : "NULL");
    cg_line(&E->w, ".set_ps_updates = %s,", on ? "model_set_ps_updates" : "NULL");
}

/* The state moves of a checkpoint (the workers hold no optimizer state): state i read from the
 * servers' snapshot, or kept from a loaded file until ps_start sends it; the descriptor's
 * wrappers of ps_snapshot and the update count. ids: the n optimizer state values, by
 * parameter, in the update op's order. */
void emit_ps_state_moves(emitter *E, const int *ids, int n) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    int states = cg_ps_states(E);
    cg_line(w, "/* Where state i is in ctx->ps_state (state k of the parameters end to end after k whole copies). */");
    cg_line(w, "static const int64_t ps_state_at[%d] = {", n);
    for (int i = 0, k = 0; i < n; i++) {
        const ir_value *s = V(E, ids[i]);
        k = i > 0 && V(E, ids[i - 1])->param_index == s->param_index ? k + 1 : 0;
        cg_line(w, "    %lld, /* %s */", (long long)cg_ps_state_at(E, s->param_index, k), s->name);
    }
    cg_line(w, "};");
    cg_line(w, "/* State i, whole: the servers' (a snapshot after this step). Every worker must call it. */");
    cg_line(w, "static int gather_state(struct_ctx *ctx, int i, float *whole) {");
    cg_line(w, "    int status = ps_snapshot(ctx);");
    cg_line(w, "    if (status != DMRT_OK) return status;");
    cg_line(w, "    memcpy(whole, ctx->ps_state + ps_state_at[i], (size_t)state_descs[i].numel * sizeof(float));");
    cg_line(w, "    return DMRT_OK;");
    cg_line(w, "}");
    cg_line(w, "/* State i from a checkpoint, kept until worker 0 starts the servers with it (ps_start). */");
    cg_line(w, "static int scatter_state(struct_ctx *ctx, int i, const float *whole) {");
    w->indent++;
    cg_line(w, "if (ctx->ps_started) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: the parameter servers hold the optimizer state from the first step on: \"", m);
    cg_line(w, "             \"load a checkpoint before it\");");
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    cg_line(w, "if (!ctx->ps_state || ctx->ps_snapshot_fresh) { /* a state the file does not set: zeros */");
    cg_line(w, "    int status = ps_state_held(ctx);");
    cg_line(w, "    if (status != DMRT_OK) return status;");
    cg_line(w, "    memset(ctx->ps_state, 0, (size_t)%lld * sizeof(float));", (long long)(states * ps_total(E)));
    cg_line(w, "    ctx->ps_snapshot_fresh = 0;");
    cg_line(w, "}");
    cg_line(w, "memcpy(ctx->ps_state + ps_state_at[i], whole, (size_t)state_descs[i].numel * sizeof(float));");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The descriptor's ps_snapshot, ps_updates and set_ps_updates. */
void emit_ps_checkpoint_hooks(emitter *E) {
    if (!emits_param_servers(E)) return;
    cg_writer *w = &E->w;
    cg_line(w, "static int model_ps_snapshot(void *ctx) { return ps_snapshot((struct_ctx *)ctx); }");
    cg_line(w, "static int64_t model_ps_updates(void *ctx) { return ((struct_ctx *)ctx)->ps_updates; }");
    cg_line(w, "static int model_set_ps_updates(void *ctx_, int64_t updates) {");
    w->indent++;
    cg_line(w, "struct_ctx *ctx = (struct_ctx *)ctx_;");
    cg_line(w, "if (updates < 0 || ctx->ps_started) {");
    cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s: %%s\", updates < 0 ? \"a negative count of updates\"", E->g->model);
    cg_line(w, "             : \"the parameter servers count their updates from the first step on: load a checkpoint before it\");");
    cg_line(w, "    return DMRT_ERR_ARG;");
    cg_line(w, "}");
    cg_line(w, "ctx->ps_updates = updates;");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}
