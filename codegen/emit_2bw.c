/* emit_2bw.c: the steps of the schedules that do not flush. 2bw (PipeDream-2BW, Narayanan et
 * al. 2021) first, then what pipedream (PipeDream's weight stashing, Narayanan et al. 2019)
 * does otherwise: the same stream, but each backward updates its stage (P - s versions).
 * 2bw: stage s of P
 * runs the 1F1B stream of every batch without a flush: a step runs the forwards of its
 * batch t, each followed by the stream's next backward, so that the backwards of batch t's
 * last P - s - 1 micro-batches run in step t + 1 (or the drain). Batch t runs on the
 * weights of update t - 1; stage s makes update t (of batch t - 1's mean gradient) right
 * after batch t - 1's last backward there, into the other of two weight versions, which no
 * batch runs on any more. So W(t + 1) = W(t) - opt(gradient of batch t at W(t - 1)).
 * Each rank keeps, across a step's end, the kept values of the micro-batches it owes (the
 * copies are chosen by a micro-batch's place in the stream) and the previous batch's
 * inputs that their backwards read. The passes chose the schedule (passes/schedule.c) and
 * counted the memory (passes/weight_versions.c). */
#include <string.h>

#include "emitter.h"

int emits_2bw(const emitter *E) { return E->stages > 1 && dm_runs_2bw(E->g) && E->g->optimizer.kind != OPTIM_NONE; }

/* pipedream rather than 2bw */
static int stashes(const emitter *E) { return dm_runs_pipedream(E->g); }

/* The inputs stage st keeps of the previous batch (bit n: input n). */
static uint64_t kept_inputs(const emitter *E, int st) { return dm_2bw_kept_inputs(E->g, E->plan, st); }

/* The inputs some stage keeps (the context's fields are every rank's). */
static uint64_t kept_by_any(const emitter *E) {
    uint64_t any = 0;
    for (int st = 0; st < E->stages; st++) any |= kept_inputs(E, st);
    return any;
}

/* Of input n, the elements of a whole batch (every micro-batch). */
static long long batch_elems(const emitter *E, int n) {
    return (long long)(ir_numel(&V(E, E->g->inputs[n])->type) * E->g->microbatches);
}

void emit_2bw_fields(emitter *E) {
    cg_writer *w = &E->w;
    if (!emits_2bw(E)) return;
    if (stashes(E)) {
        cg_line(w, "/* pipedream: versions of this rank's parameters, one per micro-batch in flight on its stage");
        cg_line(w, " * (%d - s on stage s; the others are empty); ctx->params is the one in use */", E->ranks);
        cg_line(w, "float *weights[%d];", E->ranks);
        cg_line(w, "int newest;    /* weights[newest]: the newest version (after `updates` updates) */");
        cg_line(w, "int owed;      /* 1: the previous batch's last backwards are owed here (-1: none, the stream");
        cg_line(w, "                * starts: after create or drain) */");
        cg_line(w, "int64_t updates;    /* this stage's optimizer updates: one per backward */");
        cg_line(w, "int64_t stream_from; /* the stream's number of its first micro-batch (after create or drain) */");
        cg_line(w, "int64_t tied_received[%d]; /* the updates of tied parameters received from the owner on stage s */",
                E->ranks);
    } else {
        cg_line(w, "/* 2bw: two versions of this rank's parameters; ctx->params is the one in use */");
        cg_line(w, "float *weights[2];");
        cg_line(w, "int newest;    /* weights[newest]: the newest complete version (after updates `step`) */");
        cg_line(w, "int current;   /* weights[current]: the version this step's batch runs on */");
        cg_line(w, "int owed;      /* weights[owed]: the version the previous batch ran on, whose last backwards and");
        cg_line(w, "                * update this stage owes (-1: none, the stream starts: after create or drain) */");
    }
    cg_line(w, "int64_t batches;    /* batches run (steps); the stream counts micro-batches from 0 */");
    cg_line(w, "int64_t micro_base; /* the stream's number of the running batch's micro-batch 0 */");
    cg_line(w, "int inferring;      /* in forward or predict: kept values go to the copy no owed backward holds */");
    cg_line(w, "%s_batch previous;  /* the previous batch's inputs the owed backwards read (kept copies; NULL: not read) */",
            E->g->model);
    uint64_t any = kept_by_any(E);
    for (int n = 0; n < E->g->n_inputs; n++)
        if (any >> n & 1) {
            const ir_value *v = V(E, E->g->inputs[n]);
            cg_line(w, "%s *previous_%s; /* (%lld on a stage that keeps it) */", ctype(v->type.dtype), E->cname[v->id],
                    batch_elems(E, n));
            if (E->dialect->separate_memory) /* the kernels read ctx->input_X, not the batch */
                cg_line(w, "%s *step_%s; /* the step's input_%s: input_%s points at previous_%s in an owed backward */",
                        ctype(v->type.dtype), E->cname[v->id], E->cname[v->id], E->cname[v->id], E->cname[v->id]);
        }
}

int emit_2bw_kept_count(const emitter *E, int n, char *buf, size_t size) {
    if (!emits_2bw(E) || !(kept_by_any(E) >> n & 1)) return 0;
    /* only the stages whose owed backwards read it keep it: empty on the others */
    size_t len = 0;
    for (int st = 0; st < E->stages && len < size; st++)
        if (kept_inputs(E, st) >> n & 1)
            len += (size_t)snprintf(buf + len, size - len, "ctx->coord[PIPELINE_AXIS] == %d ? %lld : ", st, batch_elems(E, n));
    if (len < size) snprintf(buf + len, size - len, "0");
    return 1;
}

void emit_2bw_create(emitter *E) {
    cg_writer *w = &E->w;
    if (!emits_2bw(E)) return;
    cg_line(w, "ctx->params = ctx->weights[0]; /* %s: initialised, the stream starts on version 0 */",
            stashes(E) ? "pipedream" : "2bw");
    cg_line(w, "ctx->owed = -1;");
    if (stashes(E)) cg_line(w, "ctx->stream_from = 0;");
    uint64_t kept = kept_by_any(E);
    for (int n = 0; n < E->g->n_inputs; n++) {
        const char *x = E->cname[E->g->inputs[n]];
        if (!(kept >> n & 1)) continue;
        cg_line(w, "ctx->previous.%s = ctx->previous_%s;", x, x);
        if (E->dialect->separate_memory) cg_line(w, "ctx->step_%s = ctx->input_%s;", x, x);
    }
}

void emit_2bw_helpers(emitter *E) {
    cg_writer *w = &E->w;
    int M = E->g->microbatches;
    if (!emits_2bw(E)) return;
    if (stashes(E)) {
        cg_line(w, "/* pipedream: the kept values of the batch to run: this step's (previous 0), or the previous");
        cg_line(w, " * step's, whose last backwards this stage owes (previous 1); a micro-batch's forward and");
        cg_line(w, " * backward choose their weights, forward, predict and save_weights see the newest. */");
        cg_line(w, "static void use_batch(struct_ctx *ctx, int previous) {");
        cg_line(w, "    ctx->params = ctx->weights[ctx->newest];");
    } else {
        cg_line(w, "/* 2bw: the weights and kept values of the batch to run: this step's (previous 0), or the");
        cg_line(w, " * previous step's, whose last backwards this stage owes (previous 1). */");
        cg_line(w, "static void use_batch(struct_ctx *ctx, int previous) {");
        cg_line(w, "    ctx->params = ctx->weights[previous ? ctx->owed : ctx->current];");
    }
    cg_line(w, "    ctx->micro_base = (ctx->batches - previous) * %d;", M);
    uint64_t kept = kept_by_any(E);
    for (int n = 0; n < E->g->n_inputs && E->dialect->separate_memory; n++)
        if (kept >> n & 1) {
            const char *x = E->cname[E->g->inputs[n]];
            cg_line(w, "    ctx->input_%s = previous ? ctx->previous_%s : ctx->step_%s; /* what the kernels read */", x, x, x);
        }
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* 2bw: which of a stage's `slots` copies of kept values micro-batch `micro` of the running");
    cg_line(w, " * batch uses: by its number in the stream, so that the micro-batches a stage owes keep theirs");
    cg_line(w, " * across the step's end. Inference between steps runs every micro-batch in the copy of the");
    cg_line(w, " * next step's first micro-batch, which no owed backward holds. */");
    cg_line(w, "static int64_t kept_slot(const struct_ctx *ctx, int64_t micro, int slots) {");
    cg_line(w, "    return (ctx->micro_base + (ctx->inferring ? 0 : micro)) %% slots;");
    cg_line(w, "}");
    cg_blank(w);
    int holders = 0;
    for (int st = 0; st < E->stages; st++) holders |= holds_tied_copies(E, st);
    if (stashes(E) && holders) {
        cg_line(w, "/* pipedream: the updates of a tied parameter its owner, `lag` stages before the last, has");
        cg_line(w, " * made when it runs stream micro-batch `micro` (the version every use of it in that");
        cg_line(w, " * micro-batch reads): one per micro-batch of earlier streams, and one per micro-batch of this");
        cg_line(w, " * one `lag` or more before `micro`; every update made when micro < 0 (the drain). */");
        cg_line(w, "static int64_t owner_updates(const struct_ctx *ctx, int64_t micro, int lag) {");
        cg_line(w, "    if (micro < 0) return ctx->batches * %d;", M);
        cg_line(w, "    return micro - lag > ctx->stream_from ? micro - lag : ctx->stream_from;");
        cg_line(w, "}");
        cg_blank(w);
    }
    if (stashes(E)) {
        cg_line(w, "/* pipedream: the end of a step: its batch's last backwards are owed (on every stage but the");
        cg_line(w, " * last), and forward, predict and save_weights see the newest weights. */");
        cg_line(w, "static void end_step(struct_ctx *ctx) {");
        cg_line(w, "    ctx->owed = 1;");
    } else {
        cg_line(w, "/* 2bw: the end of a step: its batch's last backwards are owed (on every stage but the last,");
        cg_line(w, " * which owes only the update), and the next batch runs on the newest weights, which forward,");
        cg_line(w, " * predict and save_weights see until then. */");
        cg_line(w, "static void end_step(struct_ctx *ctx) {");
        cg_line(w, "    ctx->owed = ctx->current;");
        cg_line(w, "    ctx->current = ctx->newest;");
    }
    cg_line(w, "    ctx->batches++;");
    cg_line(w, "    use_batch(ctx, 0);");
    cg_line(w, "}");
    cg_blank(w);
}

/* pipedream: makes weights[version] the newest, copying the newest there unless it is. */
static void emit_take_newest(emitter *E, long long elems) {
    cg_writer *w = &E->w;
    cg_line(w, "if (version != ctx->newest) {");
    w->indent++;
    cg_copy_elems(E, "ctx->weights[version]", "ctx->weights[ctx->newest]", elems, "float", CG_DEVICE_TO_DEVICE);
    cg_line(w, "ctx->newest = version;");
    w->indent--;
    cg_line(w, "}");
}

/* pipedream: a tied parameter's copies follow its owner's versions (vertical sync for it
 * alone): every stage's use of it in micro-batch i reads the owner's version for i, so that
 * update i, made by the owner with the sum of every use's gradient of i, is the gradient of
 * one function at one point. A holder on a later stage takes each update in before the
 * forward that needs it, which the owner made before its own forward of that micro-batch:
 * a holder never waits on a later backward or the next step, at any distance. At a step's
 * end it takes in what the owner made that step, so between steps every copy is the owner's
 * newest. 0 when stage st holds none. */
static int emit_tied_receive_fn(emitter *E, int st) {
    cg_writer *w = &E->w;
    if (!holds_tied_copies(E, st)) return 0;
    cg_line(w, "/* Stage %d: the owner's updates of the tied parameters it holds, in order, up to those of the", st);
    cg_line(w, " * owner's version for stream micro-batch `micro` (every update made: micro < 0), into the");
    cg_line(w, " * weights in use. */");
    cg_line(w, "static int stage%d_receive_tied(struct_ctx *ctx, int64_t micro) {", st);
    w->indent++;
    for (int owner = 0; owner < st; owner++) {
        if (!holds_tied_copies_of(E, st, owner)) continue;
        cg_line(w, "while (ctx->tied_received[%d] < owner_updates(ctx, micro, %d)) {", owner, E->ranks - 1 - owner);
        w->indent++;
        emit_tied_receives(E, st, owner);
        cg_line(w, "ctx->tied_received[%d]++;", owner);
        w->indent--;
        cg_line(w, "}");
    }
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    return 1;
}

/* pipedream: stage st's forward and backward of a micro-batch, each on the version the
 * micro-batch's place in the stream names (the stage's micro-batches in flight have distinct
 * ones), and the update each backward makes. */
static void emit_stashed_actions(emitter *E, int st) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    int versions = dm_weight_versions(E->g, st);
    long long elems = (long long)E->plan->stage[st].param_elems;
    int holds_tied = emit_tied_receive_fn(E, st);
    cg_line(w, "/* Stage %d's forward of micro-batch `micro` on the newest weights, stashed for its backward in", st);
    cg_line(w, " * the version its place in the stream names (of %d: that of the backward just done, or free). */",
            versions);
    cg_line(w, "static int stage%d_stashed_forward(struct_ctx *ctx, const %s_batch *batch, int64_t micro) {", st, m);
    w->indent++;
    cg_line(w, "const int version = (int)((ctx->micro_base + micro) %% %d);", versions);
    emit_take_newest(E, elems);
    cg_line(w, "ctx->params = ctx->weights[version];");
    if (holds_tied)
        cg_line(w, "if (stage%d_receive_tied(ctx, ctx->micro_base + micro) != DMRT_OK) return DMRT_ERR_COMM;", st);
    cg_line(w, "return stage%d_forward(ctx, batch, micro);", st);
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "/* Stage %d's backward of micro-batch `micro` on the weights its forward ran on, then the update", st);
    cg_line(w, " * of its gradient, applied to a copy of the newest weights in the version the micro-batch held,");
    cg_line(w, " * which is free now: it becomes the newest. */");
    cg_line(w, "static int stage%d_stashed_backward(struct_ctx *ctx, const %s_batch *batch, int64_t micro) {", st, m);
    w->indent++;
    cg_line(w, "const int version = (int)((ctx->micro_base + micro) %% %d);", versions);
    cg_line(w, "ctx->params = ctx->weights[version];");
    cg_line(w, "int status = stage%d_backward(ctx, batch, micro);", st);
    cg_line(w, "if (status != DMRT_OK) return status;");
    emit_micro_gradients(E, st);
    emit_take_newest(E, elems);
    cg_line(w, "/* the optimizer counts its updates (AdamW's bias correction, momentum's first); ctx->step");
    cg_line(w, " * counts steps */");
    cg_line(w, "const int64_t steps = ctx->step;");
    cg_line(w, "ctx->step = ++ctx->updates;");
    cg_line(w, "status = stage%d_update(ctx, batch);", st);
    cg_line(w, "ctx->step = steps;");
    cg_line(w, "return status;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* Stage st's helpers: a backward it owes, and (2bw) its next weight version. */
static void emit_owed_and_update(emitter *E, int st) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    if (stashes(E)) emit_stashed_actions(E, st);
    if (pipe_2bw_owed(E->ranks, st)) { /* the last stage owes none */
        cg_line(w, "/* Stage %d's backward of micro-batch `micro` of the previous batch, which it owed: on the", st);
        cg_line(w, " * weights that %s, with its inputs as kept. */",
                stashes(E) ? "micro-batch's forward ran on, and its update" : "batch ran on");
        cg_line(w, "static int stage%d_owed_backward(struct_ctx *ctx, int64_t micro) {", st);
        cg_line(w, "    use_batch(ctx, 1);");
        cg_line(w, "    int status = stage%d_%s(ctx, &ctx->previous, micro);", st,
                stashes(E) ? "stashed_backward" : "backward");
        cg_line(w, "    use_batch(ctx, 0);");
        cg_line(w, "    return status;");
        cg_line(w, "}");
        cg_blank(w);
    }
    if (stashes(E)) return;
    cg_line(w, "/* Stage %d's next weight version, once the previous batch's backwards are done here: their", st);
    cg_line(w, " * gradients' mean, and the update applied to a copy of the newest weights in the other version,");
    cg_line(w, " * on which no batch runs any more (the previous one ran on it, or, at the stream's start, on");
    cg_line(w, " * the newest). */");
    cg_line(w, "static int stage%d_next_version(struct_ctx *ctx, const %s_batch *batch) {", st, m);
    w->indent++;
    int any = 0;
    emit_gradient_means(E, st, &any);
    cg_line(w, "const int spare = 1 - ctx->newest;");
    cg_copy_elems(E, "ctx->weights[spare]", "ctx->weights[ctx->newest]", (long long)E->plan->stage[st].param_elems, "float",
               CG_DEVICE_TO_DEVICE);
    cg_line(w, "ctx->params = ctx->weights[spare];");
    cg_line(w, "ctx->step++;");
    cg_line(w, "int status = stage%d_update(ctx, batch);", st);
    cg_line(w, "ctx->newest = spare;");
    cg_line(w, "use_batch(ctx, 0);");
    cg_line(w, "return status;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* The previous batch's inputs stage st's owed backwards read: a copy of the step's. */
static void emit_keep_inputs(emitter *E, int st) {
    uint64_t kept = kept_inputs(E, st);
    for (int n = 0; n < E->g->n_inputs; n++) {
        if (!(kept >> n & 1)) continue;
        const ir_value *v = V(E, E->g->inputs[n]);
        char dst[160], src[160];
        snprintf(dst, sizeof dst, "ctx->previous_%s", E->cname[v->id]);
        /* separate memory: the step's copy there, which the kernels read */
        snprintf(src, sizeof src, E->dialect->separate_memory ? "ctx->input_%s" : "batch->%s", E->cname[v->id]);
        cg_line(&E->w, "/* input %s, which the owed backwards read in the next step */", v->name);
        cg_copy_elems(E, dst, src, batch_elems(E, n), ctype(v->type.dtype), CG_DEVICE_TO_DEVICE);
    }
}

/* The end of stage st's step function: the inputs its owed backwards read kept, the step
 * ended (end_step), and the function closed. */
static void emit_step_end(emitter *E, int st) {
    cg_writer *w = &E->w;
    emit_keep_inputs(E, st);
    cg_line(w, "end_step(ctx);");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* pipedream: stage st's step and drain, 2bw's stream with an update after each backward. */
static void emit_stashed_stage(emitter *E, int st) {
    cg_writer *w = &E->w;
    int M = E->g->microbatches, P = E->ranks, owed = pipe_2bw_owed(P, st);
    cg_line(w, "/* Stage %d's step of the pipedream stream (%d stages, %d micro-batches a batch): 1F1B without", st, P, M);
    cg_line(w, " * a flush. Each forward of the step's batch (on the newest weights, stashed) is followed by the");
    if (owed) {
        cg_line(w, " * stream's next backward and its update: the previous batch's last %d (owed; none when the", owed);
        cg_line(w, " * stream starts), then this batch's first %d; its last %d %s owed to the next step or the", M - owed,
                owed, owed == 1 ? "is" : "are");
        cg_line(w, " * drain. dmc --explain=full draws the stream. */");
    } else {
        cg_line(w, " * micro-batch's backward and its update: the last stage owes none. dmc --explain=full draws");
        cg_line(w, " * the stream. */");
    }
    int holds_tied = holds_tied_copies(E, st);
    cg_line(w, "static int stage%d_train(struct_ctx *ctx, const %s_batch *batch) {", st, E->g->model);
    w->indent++;
    cg_line(w, "int status;");
    if (owed) cg_line(w, "const int owes = ctx->owed >= 0;");
    cg_line(w, "use_batch(ctx, 0);");
    if (holds_tied) cg_line(w, "if (ctx->owed < 0) ctx->stream_from = ctx->micro_base; /* the stream starts */");
    for (int k = 0; k < M; k++) {
        cg_line(w, "if ((status = stage%d_stashed_forward(ctx, batch, %d)) != DMRT_OK) return status;", st, k);
        if (k < owed)
            cg_line(w, "if (owes && (status = stage%d_owed_backward(ctx, %d)) != DMRT_OK) return status;", st, M - owed + k);
        else
            cg_line(w, "if ((status = stage%d_stashed_backward(ctx, batch, %d)) != DMRT_OK) return status;", st, k - owed);
    }
    if (holds_tied) { /* the next forward's version: free (no owed backward holds it), made the newest */
        cg_line(w, "/* the tied parameters' updates the owner made this step, into the next forward's version:");
        cg_line(w, " * between steps each copy is the owner's newest */");
        cg_line(w, "{");
        w->indent++;
        cg_line(w, "const int version = (int)((ctx->micro_base + %d) %% %d);", M, dm_weight_versions(E->g, st));
        emit_take_newest(E, (long long)E->plan->stage[st].param_elems);
        cg_line(w, "ctx->params = ctx->weights[version];");
        cg_line(w, "if (stage%d_receive_tied(ctx, ctx->micro_base + %d) != DMRT_OK) return DMRT_ERR_COMM;", st, M);
        w->indent--;
        cg_line(w, "}");
    }
    emit_step_end(E, st);
    cg_line(w, "/* Stage %d's drain: the backwards it owes%s, with their updates. */", st, owed ? "" : " (none)");
    cg_line(w, "static int stage%d_drain(struct_ctx *ctx) {", st);
    w->indent++;
    if (!owed && !holds_tied) cg_line(w, "(void)ctx;");
    if (owed) cg_line(w, "int status;");
    for (int k = 0; k < owed; k++)
        cg_line(w, "if ((status = stage%d_owed_backward(ctx, %d)) != DMRT_OK) return status;", st, M - owed + k);
    if (holds_tied) { /* the owner's last updates of the stream, into the newest weights */
        cg_line(w, "ctx->params = ctx->weights[ctx->newest];");
        cg_line(w, "if (stage%d_receive_tied(ctx, -1) != DMRT_OK) return DMRT_ERR_COMM;", st);
    }
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_2bw_stage(emitter *E, int st) {
    cg_writer *w = &E->w;
    const char *m = E->g->model;
    int M = E->g->microbatches, P = E->ranks, owed = pipe_2bw_owed(P, st);
    emit_owed_and_update(E, st);
    if (stashes(E)) {
        emit_stashed_stage(E, st);
        return;
    }
    cg_line(w, "/* Stage %d's step of the 2bw stream (%d stages, %d micro-batches a batch): 1F1B without a", st, P, M);
    if (owed) {
        cg_line(w, " * flush. Each forward of the step's batch is followed by the stream's next backward: the");
        cg_line(w, " * previous batch's last %d (owed; none when the stream starts), then its update, then this", owed);
        cg_line(w, " * batch's first %d; its last %d %s owed to the next step or the drain. dmc --explain=full", M - owed, owed,
                owed == 1 ? "is" : "are");
        cg_line(w, " * draws the stream. */");
    } else {
        cg_line(w, " * flush. The previous batch's update first (none when the stream starts), then each forward");
        cg_line(w, " * of the step's batch and its backward: the last stage owes none. dmc --explain=full draws");
        cg_line(w, " * the stream. */");
    }
    cg_line(w, "static int stage%d_train(struct_ctx *ctx, const %s_batch *batch) {", st, m);
    w->indent++;
    cg_line(w, "int status;");
    cg_line(w, "const int owes = ctx->owed >= 0;");
    cg_line(w, "use_batch(ctx, 0);");
    if (!owed) cg_line(w, "if (owes && (status = stage%d_next_version(ctx, batch)) != DMRT_OK) return status;", st);
    for (int k = 0; k < M; k++) {
        cg_line(w, "if ((status = stage%d_forward(ctx, batch, %d)) != DMRT_OK) return status;", st, k);
        if (k < owed) {
            cg_line(w, "if (owes && (status = stage%d_owed_backward(ctx, %d)) != DMRT_OK) return status;", st, M - owed + k);
            if (k == owed - 1)
                cg_line(w, "if (owes && (status = stage%d_next_version(ctx, batch)) != DMRT_OK) return status;", st);
        } else {
            cg_line(w, "if ((status = stage%d_backward(ctx, batch, %d)) != DMRT_OK) return status;", st, k - owed);
        }
    }
    emit_step_end(E, st);
    if (owed) cg_line(w, "/* Stage %d's drain: the backwards it owes, and the previous batch's update. */", st);
    else cg_line(w, "/* Stage %d's drain: the previous batch's update (it owes no backward). */", st);
    cg_line(w, "static int stage%d_drain(struct_ctx *ctx) {", st);
    w->indent++;
    cg_line(w, "int status;");
    for (int k = 0; k < owed; k++)
        cg_line(w, "if ((status = stage%d_owed_backward(ctx, %d)) != DMRT_OK) return status;", st, M - owed + k);
    cg_line(w, "if ((status = stage%d_next_version(ctx, &ctx->previous)) != DMRT_OK) return status;", st);
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

void emit_2bw_declaration(emitter *E) {
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    if (!emits_2bw(E)) return;
    if (stashes(E)) {
        cg_line(w, "/* The pipedream schedule (PipeDream's weight stashing): a step does not flush the pipeline,");
        cg_line(w, " * and every micro-batch's backward updates its stage's weights (%s_step counts steps, the", m);
        cg_line(w, " * optimizer the updates); each micro-batch's backward runs on the weights its forward used on");
        cg_line(w, " * that stage. A batch's last backwards and their updates run in the next step. Between steps,");
        cg_line(w, " * forward, predict and save_weights see the newest weights. %s_drain runs what the pipeline", m);
        cg_line(w, " * owes (at the last step's learning rate), and the next step starts the stream again (as");
        cg_line(w, " * after create). Every rank must call it; it does nothing when nothing is owed. */");
        cg_line(w, "int %s_drain(%s_ctx *ctx);", m, m);
        cg_blank(w);
        return;
    }
    cg_line(w, "/* The 2bw schedule (PipeDream-2BW): a step does not flush the pipeline. train_step of batch t");
    cg_line(w, " * runs it on the weights of update t - 1 and makes update t, from batch t - 1's gradient;");
    cg_line(w, " * batch t's last backwards and update run in the next step. Between steps, forward, predict");
    cg_line(w, " * and save_weights see the newest weights (update t after step t). %s_drain runs what the", m);
    cg_line(w, " * pipeline owes: after N steps and the drain, the weights are update N's, and the next step");
    cg_line(w, " * starts the stream again (it owes nothing: as after create). Every rank must call it; it");
    cg_line(w, " * does nothing when nothing is owed. */");
    cg_line(w, "int %s_drain(%s_ctx *ctx);", m, m);
    cg_blank(w);
}

void emit_2bw_api(emitter *E) {
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    if (!emits_2bw(E)) return;
    cg_line(w, "/* A checkpoint loaded (its step set): the stream starts again, as after create or a drain (a");
    cg_line(w, " * checkpoint is written drained)%s. */", stashes(E) ? "; every step made one update a micro-batch" : "");
    cg_line(w, "static void restart_stream(struct_ctx *ctx) {");
    w->indent++;
    cg_line(w, "ctx->owed = -1;");
    if (stashes(E)) cg_line(w, "ctx->updates = ctx->step * %d;", E->g->microbatches);
    else cg_line(w, "ctx->current = ctx->newest;");
    cg_line(w, "use_batch(ctx, 0);");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "int %s_drain(%s_ctx *ctx) {", m, m);
    w->indent++;
    cg_line(w, "ctx->error[0] = 0;");
    cg_line(w, "if (ctx->owed < 0) return DMRT_OK; /* no step since create or the last drain */");
    if (stashes(E)) /* the last step's learning rate */
        cg_line(w, "/* the owed updates run at the last step's learning rate */");
    else
        cg_line(w, "if (next_learning_rate(ctx) != DMRT_OK) return DMRT_ERR_ARG;");
    cg_line(w, "int status;");
    cg_line(w, "switch (ctx->coord[PIPELINE_AXIS]) {");
    for (int r = 0; r < E->ranks; r++) cg_line(w, "case %d: status = stage%d_drain(ctx); break;", r, r);
    cg_line(w, "default: status = DMRT_ERR_ARG; break;");
    cg_line(w, "}");
    cg_line(w, "if (status != DMRT_OK) return status;");
    cg_line(w, "ctx->owed = -1;");
    if (!stashes(E)) cg_line(w, "ctx->current = ctx->newest;");
    cg_line(w, "use_batch(ctx, 0);");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_line(w, "static int model_drain(void *ctx) { return %s_drain((struct_ctx *)ctx); }", m);
    cg_blank(w);
}
