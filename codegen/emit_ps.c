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
static int ps_states(const emitter *E) {
    for (int i = 0; i < E->g->n_values; i++)
        if (ir_op_info_of(V(E, i)->op)->cls == OPC_UPDATE) return V(E, i)->n_operands - 2;
    return 0;
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
    int states = ps_states(E);
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
}

void emit_ps_fields(emitter *E) {
    if (!emits_param_servers(E)) return;
    cg_line(&E->w, "int ps_pushed; /* this worker pushed to the parameter servers (worker 0 sent them the parameters) */");
    cg_line(&E->w, "int ps_finished; /* this worker told the servers it is done (drain): no step after it */");
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
    if (E->dialect->separate_memory) { /* staged through host memory */
        cg_line(w, "if (dmrt_gpu_ps_exchange(ctx->gpu, ctx->rank, &ps_layout, !ctx->ps_pushed, %s, ctx->params, ctx->step,", grads);
        cg_line(w, "                         ctx->lr) != DMRT_OK)");
    } else {
        cg_line(w, "if (dmrt_ps_exchange(ctx->rank, &ps_layout, !ctx->ps_pushed, %s, ctx->params, ctx->step, ctx->lr) != 0)", grads);
    }
    cg_line(w, "    return comm_failed(ctx);");
    cg_line(w, "ctx->ps_pushed = 1;");
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
    cg_line(&E->w, "if (ctx->rank && ctx->params && !ctx->ps_finished) /* the servers stop once every worker says it is done */");
    if (E->dialect->separate_memory)
        cg_line(&E->w, "    (void)dmrt_gpu_ps_finish(ctx->gpu, ctx->rank, &ps_layout, ctx->ps_pushed, ctx->params);");
    else
        cg_line(&E->w, "    (void)dmrt_ps_finish(ctx->rank, &ps_layout, ctx->ps_pushed, ctx->params);");
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
    cg_line(w, "ctx->ps_finished = 1; /* destroy does not say it again, even when this fails */");
    if (E->dialect->separate_memory)
        cg_line(w, "if (dmrt_gpu_ps_finish_pull(ctx->gpu, ctx->rank, &ps_layout, ctx->ps_pushed, ctx->params) != DMRT_OK)");
    else
        cg_line(w, "if (dmrt_ps_finish_pull(ctx->rank, &ps_layout, ctx->ps_pushed, ctx->params) != 0)");
    cg_line(w, "    return comm_failed(ctx);");
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
