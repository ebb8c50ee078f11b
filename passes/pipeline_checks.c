/* pipeline_checks.c: what the pipeline pass checks of the program's requests before it
 * cuts: the interleaved schedule's model chunks, and the cuts the program names; and after
 * it cuts, whether its own cut is badly unbalanced. */
#include <stdarg.h>
#include <stdio.h>

#include "passes.h"
#include "schedule.h"

/* A diagnostic at `at`, or, where only the command line asked for what it is about (no
 * statement to point at: --chunks without a schedule or a pipeline axis), dmc's own, as
 * other command-line errors print: `dmc: error: ...`, rather than FILE:0:0 without a
 * source line. */
static void report_at(dm_diag *d, dm_loc at, int is_error, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (at.line > 0) {
        if (is_error) dm_error(d, at, "%s", msg);
        else dm_note(d, at, "%s", msg);
        return;
    }
    if (is_error) d->n_errors++;
    if (d->n_errors <= d->max_errors) fprintf(d->out, "dmc: %s: %s\n", is_error ? "error" : "note", msg);
}

static void __attribute__((format(printf, 3, 4))) error_at(dm_diag *d, dm_loc at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report_at(d, at, 1, fmt, ap);
    va_end(ap);
}

static void __attribute__((format(printf, 3, 4))) note_at(dm_diag *d, dm_loc at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report_at(d, at, 0, fmt, ap);
    va_end(ap);
}

/* 2BW's and PipeDream's steps overlap: a stage's last backwards of a batch and its updates
 * run in the next step, on the weights that batch's forward used. What needs every stage's
 * gradients of one step at one time, or state tied to the step's number, is refused: the
 * errors found. */
static int pipeline_2bw_problems(const ir_graph *g, int ranks, dm_loc at, dm_diag *d) {
    int errors = 0;
    pipe_kind kind = pipe_kind_for(g->schedule, ranks);
    const char *name = pipe_kind_name(kind);
    const char *why = pipe_2bw_problem(kind, ranks, g->microbatches);
    if (why) {
        error_at(d, at, "%d micro-batch%s cannot run as %s on %d pipeline stages: %s", g->microbatches,
                 g->microbatches == 1 ? "" : "es", name, ranks, why);
        note_at(d, at, "at the end of a step, stage s still owes the backwards of its batch's last %d - s - 1 "
                       "micro-batches; with fewer than %d a step would owe an older batch's too (--microbatches %d)",
                ranks, ranks, ranks);
        errors++;
    }
    if (g->zero > 0) {
        error_at(d, g->zero_loc.line > 0 ? g->zero_loc : at, "ZeRO (zero = %d) is not built for the %s schedule", g->zero,
                 name);
        errors++;
    }
    /* the global norm needs every stage's gradients of an update at once: 2bw's one update
     * a step agrees on it (an allreduce over the stages where each makes it); pipedream's
     * update of each micro-batch would wait on every stage's backward of it */
    if (g->optimizer.clip > 0 && kind == PIPE_PIPEDREAM) {
        dm_error(d, g->optimizer.loc, "gradient clipping is not built for the %s schedule: its norm spans the stages, "
                                      "which finish a micro-batch's gradients at different points of the stream", name);
        errors++;
    }
    if (g->compress.kind != COMPRESS_NONE) {
        char compress[64];
        dm_compress_name(&g->compress, compress, sizeof compress);
        error_at(d, at, "gradient compression (--compress %s) is not built for the %s schedule", compress, name);
        errors++;
    }
    /* a dropout mask is keyed by the updates done, which change inside a 2bw step */
    for (int i = 0; i < g->n_values && !errors; i++)
        if (g->values[i]->op == OP_DROPOUT) {
            dm_error(d, g->values[i]->loc, "dropout is not built for the %s schedule: its masks are keyed by the step, "
                                           "and a %s step updates the weights half-way", name, name);
            errors++;
        }
    return errors;
}

int pipeline_chunks(const ir_graph *g, int ranks, dm_diag *d) {
    /* where the program gave chunks, else its schedule, else (command line) the pipeline axis */
    dm_loc at = g->chunks_loc.line > 0     ? g->chunks_loc
                : g->schedule_loc.line > 0 ? g->schedule_loc
                : g->pipe_axis >= 0        ? g->axes[g->pipe_axis].loc
                                           : (dm_loc){0};
    int M = g->microbatches;
    if (g->chunks > 0 && g->schedule != PIPE_INTERLEAVED) {
        error_at(d, at, "%d model chunks per pipeline rank, but the schedule is %s: chunks go with the interleaved schedule",
                 g->chunks, pipe_kind_name((pipe_kind)g->schedule));
        note_at(d, at, "--schedule interleaved --chunks v, or schedule interleaved(microbatches = M, chunks = v)");
        return -1;
    }
    int chunks = pipe_chunks_for(g->schedule, ranks, g->chunks);
    if (pipe_flushless(pipe_kind_for(g->schedule, ranks))) return pipeline_2bw_problems(g, ranks, at, d) ? -1 : 1;
    if (pipe_kind_for(g->schedule, ranks) != PIPE_INTERLEAVED) return 1;
    if (g->chunks < 2) {
        error_at(d, at, "the interleaved schedule needs 2 or more model chunks per pipeline rank");
        note_at(d, at, "--chunks v, or schedule interleaved(microbatches = M, chunks = v)");
        return -1;
    }
    if (M % ranks != 0) {
        error_at(d, at, "%d micro-batch%s cannot run interleaved on %d pipeline ranks: each takes micro-batches "
                 "through its chunks in groups of %d", M, M == 1 ? "" : "es", ranks, ranks);
        note_at(d, at, "make the micro-batches a multiple of %d (--microbatches %d)", ranks, (M / ranks + 1) * ranks);
        return -1;
    }
    if (ranks * chunks > 64) {
        error_at(d, at, "at most 64 stages, and %d pipeline ranks x %d chunks make %d", ranks, chunks, ranks * chunks);
        return -1;
    }
    return chunks;
}

int pipeline_user_cuts(const ir_graph *g, int n_ops, const int *op, int stages, int chunks, int *boundary, dm_diag *d) {
    int errors = 0;
    if (g->n_cuts != stages - 1) {
        dm_error(d, g->cuts_loc, "%d cut%s make%s %d stages, but the pipeline %s %d", g->n_cuts, g->n_cuts == 1 ? "" : "s",
                 g->n_cuts == 1 ? "s" : "", g->n_cuts + 1, chunks > 1 ? "axis and its chunks make" : "axis has", stages);
        errors++;
    }
    for (int k = 0; k < g->n_cuts && !errors; k++) {
        int j = 0;
        while (j < n_ops && op[j] != g->cut_after[k]->id) j++;
        boundary[k + 1] = j + 1;
        if (j + 1 >= n_ops) {
            dm_error(d, g->cuts_loc, "the cut after '%s' leaves no op to the last stage", g->cut_after[k]->name);
            errors++;
        }
    }
    boundary[0] = 0;
    boundary[stages] = n_ops;
    return errors;
}

int pipeline_tied_order(const ir_graph *g, const dm_pipeline_plan *plan, dm_diag *d) {
    if (plan->ranks < 2 || plan->chunks > 1 || !dm_runs_pipedream(g)) return 0;
    int errors = 0;
    for (int t = 0; t < plan->n_tied; t++) {
        const ir_value *p = g->values[plan->tied[t]];
        for (int i = 0; i < g->n_values; i++) {
            const ir_value *v = g->values[i];
            if (v->phase != PHASE_FORWARD || ir_op_info_of(v->op)->cls == OPC_SOURCE || v->stage >= p->stage) continue;
            int reads = 0;
            for (int k = 0; k < v->n_operands; k++) reads |= v->operands[k] == p->id;
            if (!reads) continue;
            dm_error(d, v->loc, "'%s' is read here on pipeline stage %d, but its gradient is made and it is updated on "
                                "stage %d (where the loss path first reads it): the pipedream schedule sends a parameter's "
                                "updates only to later stages", p->name, v->stage, p->stage);
            dm_note(d, v->loc, "use another schedule (gpipe, 1f1b, 2bw), or read '%s' on the loss path first", p->name);
            errors++;
            break; /* one error a parameter */
        }
    }
    return errors;
}

/* A stage's slowest at over this times the mean is warned of when dmc chose the cuts. */
#define UNBALANCED 1.5

static void describe_op(const ir_graph *g, int id, char *buf, size_t size) {
    const ir_value *v = g->values[id];
    if (v->name) snprintf(buf, size, "%s", v->name);
    else snprintf(buf, size, "line %d", v->loc.line);
}

void pipeline_warn_imbalance(const ir_graph *g, const dm_pipeline_plan *plan, dm_loc at, dm_diag *d) {
    if (plan->by_user || plan->stages < 2 || !(plan->imbalance > UNBALANCED)) return;
    double total = 0;
    int slowest = 0;
    for (int k = 0; k < plan->stages; k++) {
        total += plan->stage[k].seconds;
        if (plan->stage[k].seconds > plan->stage[slowest].seconds) slowest = k;
    }
    const dm_stage_plan *s = &plan->stage[slowest];
    char first[128], last[128];
    describe_op(g, s->first, first, sizeof first);
    describe_op(g, s->last, last, sizeof last);
    /* without a mesh statement (--mesh), where the slowest stage begins */
    if (at.line < 1) at = g->values[s->first]->loc;
    dm_warning(d, at,
               "the pipeline stages dmc chose are unbalanced: stage %d (%s .. %s) takes %.1f%% of the predicted "
               "forward and backward time, %.2fx the mean of %d stages (bubble %.1f%%)",
               slowest, first, last, 100 * s->seconds / total, plan->imbalance, plan->stages, 100 * plan->bubble);
    dm_note(d, at,
            "cuts go between layers (h.0, model.layers.3) where there are enough of them, and never inside an op: "
            "name them (schedule 1f1b(microbatches = M, cuts = [...])), or use fewer stages");
}
