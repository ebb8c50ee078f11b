/* emit_schedule.c: the learning rate as a value of the context, not a literal of the
 * update: the .dm's schedule (warmup, decay; runtime/schedule.c computes it from the step
 * counter and the run's total steps), the host's override and the API that sets both. */
#include <stdio.h>

#include "emitter.h"

int emits_update(const emitter *E) {
    return E->g->optimizer.kind != OPTIM_NONE && E->g->loss >= 0 && E->g->grads;
}

void emit_schedule_declarations(emitter *E) {
    if (!emits_update(E)) return;
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    cg_line(w, "/* The learning rate. Update s (s = 1, 2, ... counted by train_step) takes its rate from the");
    cg_line(w, " * .dm's schedule; %s_set_total_steps sets the run's length N, which a decay spans", m);
    cg_line(w, " * (train_step fails without it when the .dm decays; 0: not set). %s_set_lr makes every", m);
    cg_line(w, " * later update use lr instead: a host's own schedule calls it before each train_step.");
    cg_line(w, " * %s_lr is the rate of the last update (0 before the first).%s */", m,
            E->partitioned ? " Every rank must make the same\n * calls" : "");
    cg_line(w, "int %s_set_total_steps(%s_ctx *ctx, int64_t total_steps);", m, m);
    cg_line(w, "int %s_set_lr(%s_ctx *ctx, double lr);", m, m);
    cg_line(w, "double %s_lr(const %s_ctx *ctx);", m, m);
    if (E->g->loss_scale > 0) {
        cg_line(w, "/* fp16's loss scaler (dmrt.h, dmrt_loss_scale): its scale and counts, read and set in place");
        cg_line(w, " * (a checkpoint keeps them; a host sets the same on every rank). */");
        cg_line(w, "dmrt_loss_scale *%s_loss_scale(%s_ctx *ctx);", m, m);
    }
    cg_blank(w);
}

void emit_schedule_fields(emitter *E) {
    if (!emits_update(E)) return;
    cg_writer *w = &E->w;
    cg_line(w, "double lr;            /* the learning rate of the update in progress, or of the last (0: none yet) */");
    cg_line(w, "double pinned_lr;     /* %s_set_lr's, in place of the schedule's when lr_pinned */", E->g->model);
    cg_line(w, "int lr_pinned;");
    cg_line(w, "int64_t total_steps;  /* N, the run's updates, which the decay spans (0: not set) */");
}

static const char *decay_constant(ir_decay decay) {
    switch (decay) {
    case DECAY_COSINE: return "DMRT_DECAY_COSINE";
    case DECAY_LINEAR: return "DMRT_DECAY_LINEAR";
    case DECAY_NONE: break;
    }
    return "DMRT_DECAY_NONE";
}

/* The schedule as a table, and next_learning_rate, which train_step calls first: it fails
 * before any work when the rate cannot be known. */
void emit_schedule(emitter *E) {
    if (!emits_update(E)) return;
    const ir_optimizer *o = &E->g->optimizer;
    cg_writer *w = &E->w;
    char line[160];
    cg_source_line(E, o->loc.line, line, sizeof line);
    cg_line(w, "/* %s:%d: %s */", E->source_path, o->loc.line, line);
    emit_prune_schedule(E);
    cg_line(w, "static const dmrt_lr_schedule lr_schedule = {.lr = %.17g, .warmup = %lld, .decay = %s, .min_lr = %.17g};",
            o->lr, (long long)o->warmup, decay_constant(o->decay), o->min_lr);
    cg_blank(w);
    cg_line(w, "/* The learning rate of update ctx->step + 1 into ctx->lr: the host's (%s_set_lr), else the schedule's. */",
            E->g->model);
    cg_line(w, "static int next_learning_rate(struct_ctx *ctx) {");
    w->indent++;
    cg_line(w, "if (ctx->lr_pinned) {");
    cg_line(w, "    ctx->lr = ctx->pinned_lr;");
    cg_line(w, "    return DMRT_OK;");
    cg_line(w, "}");
    if (o->decay != DECAY_NONE) {
        cg_line(w, "if (ctx->total_steps <= 0) {");
        cg_line(w, "    snprintf(ctx->error, sizeof ctx->error, \"%s:%d: the learning rate decays (decay = %s) over the run's \"",
                E->source_path, o->loc.line, ir_decay_name(o->decay));
        cg_line(w, "             \"total steps, which are not set: call %s_set_total_steps first (dmc run sets them from \"",
                E->g->model);
        cg_line(w, "             \"--steps or --epochs), or %s_set_lr\");", E->g->model);
        cg_line(w, "    return DMRT_ERR_ARG;");
        cg_line(w, "}");
    }
    emit_prune_needs_total(E);
    cg_line(w, "ctx->lr = dmrt_lr_at(&lr_schedule, ctx->step + 1, ctx->total_steps);");
    cg_line(w, "return DMRT_OK;");
    w->indent--;
    cg_line(w, "}");
    cg_blank(w);
}

/* <model>_set_total_steps, _set_lr, _lr and the descriptor's wrappers of them. */
void emit_schedule_api(emitter *E) {
    if (!emits_update(E)) return;
    const char *m = E->g->model;
    cg_writer *w = &E->w;
    cg_line(w, "int %s_set_total_steps(%s_ctx *ctx, int64_t total_steps) {", m, m);
    cg_line(w, "    ctx->error[0] = 0;");
    cg_line(w, "    if (total_steps < 0) {");
    cg_line(w, "        snprintf(ctx->error, sizeof ctx->error, \"%s_set_total_steps: %%lld steps\", (long long)total_steps);", m);
    cg_line(w, "        return DMRT_ERR_ARG;");
    cg_line(w, "    }");
    cg_line(w, "    ctx->total_steps = total_steps;");
    cg_line(w, "    return DMRT_OK;");
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "int %s_set_lr(%s_ctx *ctx, double lr) {", m, m);
    cg_line(w, "    ctx->error[0] = 0;");
    cg_line(w, "    if (!isfinite(lr) || lr < 0.0) {");
    cg_line(w, "        snprintf(ctx->error, sizeof ctx->error, \"%s_set_lr: the learning rate is a finite number >= 0, got %%g\", lr);",
            m);
    cg_line(w, "        return DMRT_ERR_ARG;");
    cg_line(w, "    }");
    cg_line(w, "    ctx->pinned_lr = lr;");
    cg_line(w, "    ctx->lr_pinned = 1;");
    cg_line(w, "    return DMRT_OK;");
    cg_line(w, "}");
    cg_blank(w);
    cg_line(w, "double %s_lr(const %s_ctx *ctx) { return ctx->lr; }", m, m);
    cg_blank(w);
    cg_line(w, "static int model_set_total_steps(void *ctx, int64_t n) { return %s_set_total_steps((struct_ctx *)ctx, n); }", m);
    cg_line(w, "static int model_set_lr(void *ctx, double lr) { return %s_set_lr((struct_ctx *)ctx, lr); }", m);
    cg_line(w, "static double model_lr(void *ctx) { return %s_lr((const struct_ctx *)ctx); }", m);
    if (E->g->loss_scale > 0) {
        cg_line(w, "dmrt_loss_scale *%s_loss_scale(%s_ctx *ctx) { return &ctx->loss_scale; }", m, m);
        cg_line(w, "static dmrt_loss_scale *model_loss_scale(void *ctx) { return %s_loss_scale((struct_ctx *)ctx); }", m);
    }
    cg_blank(w);
}

void emit_schedule_descriptor(emitter *E) {
    int on = emits_update(E);
    cg_line(&E->w, ".set_total_steps = %s,", on ? "model_set_total_steps" : "NULL");
    cg_line(&E->w, ".set_lr = %s,", on ? "model_set_lr" : "NULL");
    cg_line(&E->w, ".lr = %s,", on ? "model_lr" : "NULL");
}
