/* emit_clip.c: gradient clipping as torch.nn.utils.clip_grad_norm_(max_norm = clip). In
 * an update function, after every gradient is reduced (emit_phase emits the function's
 * reductions first) and before any update reads one: the L2 norm of all the model's
 * gradients over the whole mesh and, when clip / (norm + 1e-6) is below 1, every
 * gradient multiplied by it.
 *
 * Each element is counted once over the mesh. A rank adds the squares of a block it
 * holds only where it holds the first copy along every axis the gradient is replicated
 * on (data once the allreduce made the replicas equal; tensor for a parameter such as a
 * bias that tensor parallelism does not split). Blocks split over an axis (a
 * tensor-parallel weight, ZeRO's shares over data) and pipeline stages (each updates
 * its own parameters; a tied one is updated by its owner only) are disjoint: all count.
 * One allreduce of the sum along every mesh axis then gives each rank the same total,
 * so that replicas scale their copies alike. Under parameter servers (fp16's check only:
 * they refuse clipping) a worker's gradients are its own, not reduced: every worker
 * checks all of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emitter.h"

/* The C condition under which this rank counts its block of a gradient of type t ("" on
 * every rank), and the comment that says why. zero_axis: the axis ZeRO splits it over, or
 * -1. */
static void counted_here(const emitter *E, const ir_type *t, int zero_axis, char *cond, size_t cond_size, char *why,
                         size_t why_size) {
    const ir_graph *g = E->g;
    uint32_t split = zero_axis >= 0 ? 1u << zero_axis : 0;
    for (int d = 0; d < t->rank; d++)
        if (t->split[d] != IR_REPLICATED) split |= 1u << t->split[d];
    if (t->partial) {
        fprintf(stderr, "dmc: internal error: an update reads a gradient with a pending sum\n");
        abort();
    }
    size_t c = 0, w = 0;
    cond[0] = why[0] = 0;
    if (emits_param_servers(E)) { /* the servers sum the workers' gradients: each differs */
        snprintf(why, why_size, "this worker's own (the servers sum them)");
        return;
    }
    for (int a = 0; E->partitioned && a < g->n_axes; a++) {
        if (axis_size(E, a) == 1 || a == g->pipe_axis) continue;
        int replicated = !(split >> a & 1);
        w += (size_t)snprintf(why + w, w < why_size ? why_size - w : 0, "%s%s %s", w ? ", " : "",
                              replicated ? "a copy on every" : "split over", g->axes[a].name);
        if (replicated)
            c += (size_t)snprintf(cond + c, c < cond_size ? cond_size - c : 0, "%sctx->coord[%d] == 0", c ? " && " : "", a);
    }
    if (!w) snprintf(why, why_size, "whole here");
}

/* Squares of the block into acc (a double: sum_squares, or unscaled_squares), by the ranks
 * that count it. */
static void add_squares(emitter *E, const char *name, const ir_type *t, int zero_axis, const char *x, const char *count,
                        const char *acc) {
    char cond[256], why[256];
    counted_here(E, t, zero_axis, cond, sizeof cond, why, sizeof why);
    cg_line(&E->w, "/* %s: %s%s */", name, why, cond[0] ? "; counted by the first copy" : "");
    if (cond[0]) {
        cg_line(&E->w, "if (%s) {", cond);
        E->w.indent++;
    }
    E->dialect->sum_squares(&E->w, x, count, acc);
    if (cond[0]) {
        E->w.indent--;
        cg_line(&E->w, "}");
    }
}

/* What each_gradient does with a gradient: on the host, its squares added to sum_squares
 * or it multiplied by the float `factor` (UNSCALE: the same, but for the gradients that
 * compression unscaled before reducing them); on the device (no wait), its squares into
 * its slot, or it multiplied by the device's factor; or nothing, counting them. */
enum { ADD_SQUARES, SCALE, UNSCALE, DEVICE_SQUARES, DEVICE_SCALE, COUNT_ONLY };


/* Whether parameter p's gradient was unscaled before its compressed reduction. */
static int unscaled_before(const emitter *E, int p) {
    int grad = E->g->grads ? E->g->grads[p] : -1;
    return cg_compress_checks_scaled(E) && grad >= 0 && E->bucket_lead[grad] >= 0 &&
           dm_compress_bucket_of(E->compress, E->bucket_lead[grad]) != NULL;
}

/* Whether some gradient stage's update reads is left for the scaler to unscale (ZeRO's
 * shares always: compression refuses ZeRO). */
static int unscales_after(const emitter *E, int stage) {
    if (!cg_compress_checks_scaled(E)) return 1;
    for (int i = 0; i < E->g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->phase == PHASE_UPDATE && ir_op_info_of(v->op)->cls == OPC_UPDATE && (stage < 0 || v->stage == stage) &&
            !unscaled_before(E, v->param_index))
            return 1;
    }
    return 0;
}

/* Whether the update function of stage (-1: the only one) reduces a compressed bucket: it
 * then has the check emit_compressed_reduce made (compress_not_finite). */
static int checks_before_compression(const emitter *E, int stage) {
    for (int k = 0; cg_compress_checks_scaled(E) && k < E->compress->n_buckets; k++)
        if (stage < 0 || E->compress->bucket[k].stage == stage) return 1;
    return 0;
}

/* Every gradient the function's updates read, whole or (ZeRO) the rank's share of it,
 * done `what` to; how many there are (ZeRO's outside the count but for COUNT_ONLY: not on
 * the device path). */
static int each_gradient(emitter *E, int stage, int what, const char *factor) {
    const ir_graph *g = E->g;
    char count[32];
    int slot = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = V(E, i);
        if (v->phase != PHASE_UPDATE || ir_op_info_of(v->op)->cls != OPC_UPDATE || (stage >= 0 && v->stage != stage) ||
            zero_bucket_of(E, v->param_index))
            continue;
        int grad = v->operands[1];
        snprintf(count, sizeof count, "%lld", (long long)ir_numel(T(E, grad)));
        if (what == ADD_SQUARES)
            /* an interleaved chunk's gradient compression unscaled: its squares apart (emit_chunk_squares) */
            add_squares(E, V(E, g->params[v->param_index])->name, &V(E, grad)->type, -1, E->cname[grad], count,
                        E->update_half == 1 && unscaled_before(E, v->param_index) ? "unscaled_squares" : "sum_squares");
        else if (what == SCALE || (what == UNSCALE && !unscaled_before(E, v->param_index)))
            E->dialect->scale(&E->w, E->cname[grad], count, factor);
        else if (what == DEVICE_SQUARES) E->dialect->clip_squares(&E->w, E->cname[grad], count, slot);
        else if (what == DEVICE_SCALE) E->dialect->clip_scale(&E->w, E->cname[grad], count);
        slot++;
    }
    if (what == DEVICE_SQUARES || what == DEVICE_SCALE) return slot;
    for (int k = 0; k < E->zero->n_buckets; k++) {
        const dm_zero_bucket *b = &E->zero->bucket[k];
        if (stage >= 0 && V(E, g->params[b->first])->stage != stage) continue;
        if (what == COUNT_ONLY) {
            slot++;
            continue;
        }
        char share[96];
        zero_grad_share(E, b, share, sizeof share);
        cg_line(&E->w, "{");
        E->w.indent++;
        cg_line(&E->w, "const int64_t share_begin = ctx->coord[%d] * (int64_t)%lld; /* this rank's share of ZeRO's range */",
                b->axis, (long long)b->share);
        for (int p = b->first; p <= b->last; p++) {
            zero_open_member(E, b, p);
            cg_line(&E->w, "float *grad_share = %s + (lo - share_begin);", share);
            if (what == ADD_SQUARES)
                add_squares(E, "its share", &V(E, g->grads[p])->type, b->axis, "grad_share", "(hi - lo)", "sum_squares");
            else E->dialect->scale(&E->w, "grad_share", "(hi - lo)", factor);
            zero_close_member(E);
        }
        E->w.indent--;
        cg_line(&E->w, "}");
    }
    return slot;
}

/* One float summed over every mesh axis, so that every rank has the same total. */
void cg_sum_over_mesh(emitter *E, const char *x, const char *what) {
    const ir_graph *g = E->g;
    for (int a = 0; E->partitioned && a < g->n_axes; a++) {
        if (axis_size(E, a) == 1) continue;
        cg_line(&E->w, "if (dmrt_allreduce_sum(ctx->comm[%d], &%s, 1, \"%s over %s\") != 0)", a, x, what, g->axes[a].name);
        cg_line(&E->w, "    return comm_failed(ctx);");
    }
}

/* The scaler's check joins the one made before compression: where this function reduced
 * no compressed bucket (a pipeline stage without them), it still takes its part in that
 * check's sums over the mesh, which the other stages' functions make. */
static void join_compress_check(emitter *E, int stage) {
    if (!cg_compress_checks_scaled(E)) return;
    if (!checks_before_compression(E, stage)) {
        cg_line(&E->w, "float compress_not_finite = 0.0f; /* no compressed bucket here: this rank's part in the check */");
        cg_sum_over_mesh(E, "compress_not_finite", "loss scaling: the check before compression");
    }
    cg_line(&E->w, "if (compress_not_finite != 0.0f) not_finite = 1.0f; /* the compressed gradients were not reduced */");
}

/* The scaler's decision once not_finite holds this rank's part of the check: one sum over
 * the mesh, and a step with any element not finite anywhere skipped (the function returns
 * before any update) with the scale halved. */
static void emit_loss_skip(emitter *E) {
    cg_writer *w = &E->w;
    /* synchronous parameter servers: every worker skips the same steps, and pushes nothing
     * then; asynchronous ones: each worker has a scaler of its own (a decision over the
     * mesh would make the workers wait for each other every step), and its skipped step
     * goes to the servers without gradients */
    if (emits_async_param_servers(E))
        cg_line(w, "/* asynchronous parameter servers: this worker's own scaler, decided by its own gradients */");
    else
        cg_sum_over_mesh(E, "not_finite", "loss scaling: the gradients' check");
    cg_line(w, "if (not_finite != 0.0f) {");
    cg_line(w, "    ctx->loss_scale.scale *= 0.5;");
    cg_line(w, "    ctx->loss_scale.good_steps = 0;");
    cg_line(w, "    ctx->loss_scale.skipped++;");
    cg_line(w, "    ctx->loss_scale.last_skipped = 1;");
    emit_ps_skipped_exchange(E);
    cg_line(w, "    return DMRT_OK; /* ctx->step counts it (the learning rate moves on, as a scheduler stepped per");
    cg_line(w, "                     * iteration does); the optimizer's own count does not (cg_updates_done)%s */",
            emits_param_servers(E) && !emits_async_param_servers(E) ? "; nothing is pushed" : "");
    cg_line(w, "}");
}

/* A clean step: counted, and the scale doubled after ctx->loss_scale.interval of them in a row. */
static void emit_loss_clean(cg_writer *w) {
    cg_line(w, "ctx->loss_scale.last_skipped = 0;");
    cg_line(w, "if (++ctx->loss_scale.good_steps == ctx->loss_scale.interval) {");
    cg_line(w, "    ctx->loss_scale.scale *= 2.0;");
    cg_line(w, "    ctx->loss_scale.good_steps = 0;");
    cg_line(w, "}");
}

void emit_loss_unscale(emitter *E, int stage) {
    cg_writer *w = &E->w;
    cg_blank(w);
    cg_line(w, "/* loss scaling (fp16, torch.cuda.amp.GradScaler's rule): the gradients were of the loss times");
    cg_line(w, " * ctx->loss_scale.scale; a step with any gradient element not finite on any rank is skipped (no");
    cg_line(w, " * update, not counted) and the scale halved; else the gradients are unscaled, and the scale");
    cg_line(w, " * doubles after ctx->loss_scale.interval clean steps in a row */");
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "double sum_squares = 0.0; /* NaN or inf when an element is: a float's square stays finite in a double */");
    each_gradient(E, stage, ADD_SQUARES, NULL);
    cg_line(w, "float not_finite = isfinite(sum_squares) ? 0.0f : 1.0f;");
    join_compress_check(E, stage);
    emit_loss_skip(E);
    if (unscales_after(E, stage)) { /* (compression may have unscaled every one) */
        cg_line(w, "const float unscale = (float)(1.0 / ctx->loss_scale.scale);");
        each_gradient(E, stage, UNSCALE, "unscale");
    }
    emit_loss_clean(w);
    w->indent--;
    cg_line(w, "}");
}

/* Interleaved: a rank's chunks are stages with update functions of their own, but one
 * model to the scaler and to clipping, whose rules are one decision a step over every
 * gradient. Were each chunk's function to decide, a step would halve the scale once per
 * chunk that overflowed, count as many skips (the optimizer's update count, step - skipped,
 * then runs behind and below zero: AdamW's bias correction turns NaN), the chunks could
 * disagree on skipping, and a later chunk would unscale by a scale an earlier one had
 * already grown; clipping would take a norm per chunk. So each chunk's update is split in
 * two (emit_step.c): its reductions then this, its gradients' squares added to the rank's
 * sum; the rank decides (emit_rank_loss_skip: not finite, a skipped step; emit_rank_clip:
 * the norm over the mesh and the factor); then each chunk unscales (emit_chunk_unscale) or
 * clips (emit_chunk_clip) and updates; then the rank counts the clean step
 * (emit_rank_loss_clean); a ZeRO bucket counts its rank's share. Under fp16 with clipping
 * the squares are of the scaled gradients, and the rank divides their sum by the scale
 * squared (exact: a power of two) before the norm. Parameter servers do not run interleaved.
 * Top-k and PowerSGD under fp16 check every chunk's partials in the rank's update before
 * any chunk reduces (emit_rank_compress_check), and the gradients they unscaled count
 * their squares times the scale squared, as the others' scaled ones. */
void emit_chunk_squares(emitter *E, int stage) {
    cg_writer *w = &E->w;
    cg_blank(w);
    if (each_gradient(E, stage, COUNT_ONLY, NULL) == 0) {
        cg_line(w, "(void)rank_squares; /* this stage updates no parameter */");
        return;
    }
    cg_line(w, "/* %s: this stage's part, the squares of its gradients, into the rank's sum (its update function",
            E->g->loss_scale > 0 ? "fp16's loss scaler" : "gradient clipping");
    cg_line(w, " * decides once for all its chunks, over the mesh) */");
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "double sum_squares = 0.0; /* NaN or inf when an element is: a float's square stays finite in a double */");
    if (cg_compress_checks_scaled(E))
        cg_line(w, "double unscaled_squares = 0.0; /* of the gradients compression unscaled before reducing them */");
    each_gradient(E, stage, ADD_SQUARES, NULL);
    if (cg_compress_checks_scaled(E)) {
        cg_line(w, "/* as the scaled gradients' squares, which the rank's sum is of (x the scale squared: a power");
        cg_line(w, " * of two, exact) */");
        cg_line(w, "sum_squares += unscaled_squares * (ctx->loss_scale.scale * ctx->loss_scale.scale);");
    }
    cg_line(w, "*rank_squares += sum_squares;");
    w->indent--;
    cg_line(w, "}");
}

void emit_rank_loss_skip(emitter *E) {
    cg_line(&E->w, "float not_finite = isfinite(rank_squares) ? 0.0f : 1.0f; /* 1: some chunk's gradients hold an element that is not */");
    if (cg_compress_checks_scaled(E))
        cg_line(&E->w, "if (compress_not_finite != 0.0f) not_finite = 1.0f; /* the compressed gradients were not reduced */");
    cg_line(&E->w, "/* loss scaling (fp16, torch.cuda.amp.GradScaler's rule), decided once for the rank's chunks as");
    cg_line(&E->w, " * for one model: a step with any gradient element not finite on any chunk of any rank is skipped");
    cg_line(&E->w, " * by every chunk (no update, not counted) and the scale halved once; else each chunk unscales");
    cg_line(&E->w, " * its gradients and updates, and the scale doubles after ctx->loss_scale.interval clean steps */");
    emit_loss_skip(E);
}

void emit_chunk_unscale(emitter *E, int stage) {
    cg_writer *w = &E->w;
    if (each_gradient(E, stage, COUNT_ONLY, NULL) == 0) return;
    cg_blank(w);
    cg_line(w, "/* fp16: every chunk's gradients were finite (its rank's update decided): unscaled, by the step's");
    cg_line(w, " * scale (the rank changes it after all its chunks' updates) */");
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "const float unscale = (float)(1.0 / ctx->loss_scale.scale);");
    each_gradient(E, stage, UNSCALE, "unscale");
    w->indent--;
    cg_line(w, "}");
}

void emit_rank_clip(emitter *E) {
    const ir_optimizer *o = &E->g->optimizer;
    cg_writer *w = &E->w;
    char clip[64];
    cg_float_literal(o->clip, clip, sizeof clip);
    cg_line(w, "/* clip = %g: the L2 norm of every chunk's gradients over the mesh, each element counted once, as", o->clip);
    cg_line(w, " * for one model; each chunk scales its gradients by clip / (norm + 1e-6) where that is below 1");
    cg_line(w, " * (torch.nn.utils.clip_grad_norm_) */");
    if (E->g->loss_scale > 0) {
        cg_line(w, "/* fp16: the chunks' squares are of the scaled gradients; over the scale squared (a power of two:");
        cg_line(w, " * exact) they are the unscaled gradients' squares, which the norm is of */");
        cg_line(w, "float norm_squared = (float)(rank_squares / (ctx->loss_scale.scale * ctx->loss_scale.scale));");
    } else {
        cg_line(w, "float norm_squared = (float)rank_squares;");
    }
    cg_sum_over_mesh(E, "norm_squared", "gradient clipping: the squares");
    cg_line(w, "const float clip_scale = %s / (sqrtf(norm_squared) + 1e-6f);", clip);
}

void emit_chunk_clip(emitter *E, int stage) {
    cg_writer *w = &E->w;
    if (each_gradient(E, stage, COUNT_ONLY, NULL) == 0) {
        cg_line(w, "(void)clip_scale; /* this stage updates no parameter */");
        return;
    }
    cg_blank(w);
    cg_line(w, "/* gradient clipping: the factor its rank computed over every chunk's gradients */");
    cg_line(w, "if (clip_scale < 1.0f) {");
    w->indent++;
    each_gradient(E, stage, SCALE, "clip_scale");
    w->indent--;
    cg_line(w, "}");
}

void emit_rank_loss_clean(emitter *E) {
    cg_line(&E->w, "/* fp16: the clean step counted once for all the rank's chunks */");
    emit_loss_clean(&E->w);
}

/* Clipping on the device, without a wait: a program whose step ends in one wait
 * (emit_step_end.c) whose dialect can, with no mesh and no ZeRO to sum over. */
static int clips_on_device(const emitter *E) {
    return E->g->optimizer.clip > 0 && emits_step_end(E) && E->dialect->clip_factor && E->zero->n_buckets == 0;
}

void emit_clip_reserve(emitter *E) {
    if (!clips_on_device(E)) return;
    cg_line(&E->w, "/* device room for gradient clipping's squares, summed there (no wait) */");
    E->dialect->clip_reserve(&E->w, each_gradient(E, -1, COUNT_ONLY, NULL), "{ (void)device_failed(ctx); goto fail; }");
}

void emit_clip(emitter *E, int stage) {
    const ir_graph *g = E->g;
    const ir_optimizer *o = &g->optimizer;
    cg_writer *w = &E->w;
    char line[160], clip[64];
    cg_source_line(E, o->loc.line, line, sizeof line);
    cg_float_literal(o->clip, clip, sizeof clip);
    cg_blank(w);
    cg_line(w, "/* %s:%d: %s */", E->source_path, o->loc.line, line);
    if (clips_on_device(E)) {
        cg_line(w, "/* clip = %g: the L2 norm of every gradient, its squares summed and the factor clip / (norm + 1e-6)", o->clip);
        cg_line(w, " * computed on the device in the host's order (no wait); the gradients scaled by it where it is below");
        cg_line(w, " * 1 (torch.nn.utils.clip_grad_norm_) */");
        int n = each_gradient(E, stage, DEVICE_SQUARES, NULL);
        E->dialect->clip_factor(w, n, clip);
        each_gradient(E, stage, DEVICE_SCALE, NULL);
        return;
    }
    cg_line(w, "/* clip = %g: the L2 norm of every gradient over the mesh, each element counted once; the", o->clip);
    cg_line(w, " * gradients scaled by clip / (norm + 1e-6) where that is below 1 (torch.nn.utils.clip_grad_norm_) */");
    cg_line(w, "{");
    w->indent++;
    cg_line(w, "double sum_squares = 0.0;");
    each_gradient(E, stage, ADD_SQUARES, NULL);
    cg_line(w, "float norm_squared = (float)sum_squares;");
    cg_sum_over_mesh(E, "norm_squared", "gradient clipping: the squares");
    cg_line(w, "const float clip_scale = %s / (sqrtf(norm_squared) + 1e-6f);", clip);
    cg_line(w, "if (clip_scale < 1.0f) {");
    w->indent++;
    each_gradient(E, stage, SCALE, "clip_scale");
    w->indent--;
    cg_line(w, "}");
    w->indent--;
    cg_line(w, "}");
}

const char *cg_updates_done(const emitter *E) {
    return E->g->loss_scale > 0 ? "(ctx->step - ctx->loss_scale.skipped)" : "ctx->step";
}

const ir_optimizer *cg_param_optimizer(const emitter *E, int p, ir_optimizer *scratch) {
    const ir_graph *g = E->g;
    if (!g->optimizer.no_decay_1d || p < 0 || !ir_param_is_1d(g, p)) return &g->optimizer;
    *scratch = g->optimizer;
    scratch->weight_decay = 0;
    return scratch;
}
