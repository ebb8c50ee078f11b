/* stage_estimate.c: the planner's estimate of a deep model's pipeline stages from a
 * two-layer probe (driver/plan.c's search, pipeline_estimate_stages): the probe's forward
 * ops measured as the pipeline pass measures them (passes/pipeline_costs.h), its repeated
 * layer's second instance laid out as many times as the model has layers, then cut as the
 * pipeline pass cuts. */
#include <stdlib.h>
#include <string.h>

#include "hardware.h"
#include "passes.h"
#include "pipeline_costs.h"
#include "schedule.h"

/* Where each op of the probe's forward pass sits: before the repeated layer, in its first
 * or second instance ("group.0", "group.1"), or after. Returns -1 unless the second
 * instance's ops all follow the first's; [*a0, *a1) and [*a1, *a2) are the instances
 * (ops made from parameters alone, ZeRO 3's gathers, count where they run). */
static int find_instances(const ir_graph *g, const pipe_costs *c, const char *group, int *a0, int *a1, int *a2) {
    char key[2][256];
    snprintf(key[0], sizeof key[0], "%s.0", group);
    snprintf(key[1], sizeof key[1], "%s.1", group);
    int first[2] = {-1, -1}, last[2] = {-1, -1};
    /* values computed from parameters alone */
    char *param_side = pipe_xcalloc((size_t)g->n_values, 1);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        int only = v->op != OP_PARAM && v->n_operands > 0;
        for (int k = 0; k < v->n_operands && only; k++) {
            const ir_value *x = g->values[v->operands[k]];
            only = x->op == OP_PARAM || x->role == ROLE_CONST || param_side[x->id];
        }
        param_side[i] = (char)only;
    }
    for (int j = 0; j < c->n; j++) {
        const char *name = g->values[c->op[j]]->name;
        /* ZeRO 3 gathers a layer's parameters (and views them) while the layers before
         * run: they belong where they run */
        if (!name || param_side[c->op[j]]) continue;
        size_t len = pipe_layer_key(name);
        for (int q = 0; q < 2; q++)
            if (len == strlen(key[q]) && strncmp(name, key[q], len) == 0) {
                if (first[q] < 0) first[q] = j;
                last[q] = j;
            }
    }
    free(param_side);
    /* the second instance runs from the end of the first (gathers for it included) */
    if (first[0] < 0 || first[1] <= last[0]) return -1;
    *a0 = first[0], *a1 = last[0] + 1, *a2 = last[1] + 1;
    return 0;
}

/* The update phase and the model flops by forward position: an update-phase op counts
 * where its parameter is first used, a backward op where its origin runs. */
typedef struct update_costs {
    double *seconds;     /* (n + 1) per op, the reductions' latency left out */
    double *cached;      /* (n + 1) the same with its bytes in cache */
    double *bytes;       /* (n + 1) the bytes the update ops move */
    double *link;        /* (n + 1) the part of seconds its reductions spend on links */
    double *reduced;     /* (n + 1) * IR_MAX_AXES bytes reduced over each axis */
    double steps[IR_MAX_AXES]; /* ring steps of one reduction over each axis */
    double *model_flops; /* (n + 1) model_flops_of */
} update_costs;

static int param_of(const ir_graph *g, const ir_value *v) {
    if (v->param_index >= 0) return v->param_index;
    for (int k = 0; k < v->n_operands; k++)
        if (g->values[v->operands[k]]->param_index >= 0) return g->values[v->operands[k]]->param_index;
    return -1;
}

static void measure_update(const ir_graph *g, const pipe_costs *c, update_costs *u) {
    int n = c->n;
    u->seconds = pipe_xcalloc((size_t)n + 1, sizeof(double));
    u->cached = pipe_xcalloc((size_t)n + 1, sizeof(double));
    u->bytes = pipe_xcalloc((size_t)n + 1, sizeof(double));
    u->link = pipe_xcalloc((size_t)n + 1, sizeof(double));
    u->reduced = pipe_xcalloc(((size_t)n + 1) * IR_MAX_AXES, sizeof(double));
    u->model_flops = pipe_xcalloc((size_t)n + 1, sizeof(double));
    memset(u->steps, 0, sizeof u->steps);
    int *pos = pipe_xcalloc((size_t)g->n_values, sizeof(int)), *param_at = pipe_xcalloc((size_t)g->n_params + 1, sizeof(int));
    char *in_shares = dm_zero_gathered_params(g);
    for (int i = 0; i < g->n_values; i++) pos[i] = -1;
    for (int j = 0; j < n; j++) pos[c->op[j]] = j;
    for (int p = 0; p < g->n_params; p++) param_at[p] = n - 1;
    for (int j = n - 1; j >= 0; j--) {
        const ir_value *v = g->values[c->op[j]];
        for (int k = 0; k < v->n_operands; k++) {
            const ir_value *x = g->values[v->operands[k]];
            if (x->op == OP_PARAM && x->param_index >= 0) param_at[x->param_index] = j;
        }
    }
    /* the mean of the micro-batches' gradient sums (pipeline.c's predict_update): at its
     * parameter, the same in memory and in cache (it is not the update's working set) */
    for (int p = 0; c->microbatches > 1 && p < g->n_params; p++) {
        int grad = g->grads ? g->grads[p] : -1;
        if (grad < 0 || param_at[p] < 0) continue;
        double t = pipe_grad_mean_seconds(g, c->model, c->microbatches, (double)ir_local_numel(g, &g->values[grad]->type));
        u->seconds[param_at[p]] += t;
        u->cached[param_at[p]] += t;
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase == PHASE_UPDATE) {
            int p = param_of(g, v), at = p >= 0 ? param_at[p] : n - 1;
            if (at >= 0)
                u->seconds[at] +=
                    pipe_update_op_seconds(g, c->model, v, in_shares, u->reduced + (size_t)at * IR_MAX_AXES, u->steps,
                                           &u->link[at], &u->cached[at], &u->bytes[at]);
            continue;
        }
        int at = pos[i] >= 0 ? pos[i] : v->origin ? pos[v->origin->id] : -1;
        if (at < 0) continue;
        dm_op_cost oc = cost_of_op(g, v);
        u->model_flops[at] += pipe_model_flops_of(v, &oc);
    }
    free(pos);
    free(param_at);
    free(in_shares);
}

static void update_costs_free(update_costs *u) {
    free(u->seconds);
    free(u->cached);
    free(u->bytes);
    free(u->link);
    free(u->reduced);
    free(u->model_flops);
}

/* The deep model as the probe lays it out: the ops before the second instance, the second
 * `layers - 1` times, the rest. */
typedef struct layout {
    int n, a1, a2;      /* the probe's forward ops; its second instance is [a1, a2) */
    int64_t layers;
    int m;              /* ops laid out */
} layout;

/* What the estimate sums over the laid-out ops, a column each: the cut's costs (pipe_costs'),
 * the update's and the model flops (update_costs'), then the bytes reduced over each mesh
 * axis. A row has a fixed width (the last columns 0) so that the compiler adds rows as
 * vectors: each column is still summed op after op. */
enum { SUM_SECONDS, SUM_FORWARD, SUM_ACTIVATION, SUM_PARAMS, SUM_UPDATE, SUM_UPDATE_CACHED, SUM_UPDATE_BYTES,
       SUM_LINK, SUM_FLOPS, SUM_REDUCED, SUM_COLUMNS = 18 };
_Static_assert(SUM_REDUCED + IR_MAX_AXES <= SUM_COLUMNS, "a row holds every mesh axis");

/* The probe's per-op costs (not summed) as rows. */
static double *probe_rows(const pipe_costs *c, const update_costs *u) {
    double *rows = pipe_xcalloc((size_t)c->n * SUM_COLUMNS, sizeof(double));
    for (int j = 0; j < c->n; j++) {
        double *row = rows + (size_t)j * SUM_COLUMNS;
        row[SUM_SECONDS] = c->seconds[j], row[SUM_FORWARD] = c->forward[j];
        row[SUM_ACTIVATION] = c->activation[j], row[SUM_PARAMS] = c->params[j];
        row[SUM_UPDATE] = u->seconds[j], row[SUM_UPDATE_CACHED] = u->cached[j], row[SUM_UPDATE_BYTES] = u->bytes[j];
        row[SUM_LINK] = u->link[j], row[SUM_FLOPS] = u->model_flops[j];
        memcpy(row + SUM_REDUCED, u->reduced + (size_t)j * IR_MAX_AXES, IR_MAX_AXES * sizeof(double));
    }
    return rows;
}

/* The sums over the laid-out ops before each position a stage may start at (the layer
 * starts, or every op when all_ops; 0 and m always): rows into sums, the
 * positions' probe ops (n for m) into op, their count returned. Only these are ever read, so
 * the deep model is not laid out whole (ten arrays of ten thousand ops per probe); each sum
 * adds the same doubles in the same order as summing the laid-out arrays would. */
static int sum_laid_out(const layout *l, const double *rows, const char *layer_start, int all_ops, double *sums,
                        int *op) {
    double sum[SUM_COLUMNS] = {0};
    const struct { int from, to; int64_t times; } parts[] = {{0, l->a1, 1}, {l->a1, l->a2, l->layers - 1}, {l->a2, l->n, 1}};
    int kept = 0, first = 1;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (int64_t t = 0; t < parts[p].times; t++)
            for (int i = parts[p].from; i < parts[p].to; i++) {
                if (first || all_ops || layer_start[i]) {
                    for (int a = 0; a < SUM_COLUMNS; a++) sums[(size_t)kept * SUM_COLUMNS + (size_t)a] = sum[a];
                    op[kept++] = i;
                }
                first = 0;
                const double *row = rows + (size_t)i * SUM_COLUMNS;
#pragma GCC unroll 18
                for (int a = 0; a < SUM_COLUMNS; a++) sum[a] += row[a];
            }
    memcpy(sums + (size_t)kept * SUM_COLUMNS, sum, sizeof sum);
    op[kept++] = l->n;
    return kept;
}

/* Layer starts among the laid-out ops 1 .. m - 1 (the boundaries inside the model). */
static int64_t laid_out_layer_starts(const layout *l, const char *layer_start) {
    int64_t before = 0, layer = 0, after = 0;
    for (int i = 1; i < l->a1; i++) before += layer_start[i];
    for (int i = l->a1; i < l->a2; i++) layer += layer_start[i];
    for (int i = l->a2; i < l->n; i++) after += layer_start[i];
    return before + (l->layers - 1) * layer + after;
}

/* The cut's costs at the kept positions as a pipe_costs whose ops are the spans between
 * them: every one may start a stage, as each kept position may in the model laid out. */
static void kept_costs(const pipe_costs *c, const double *sums, const int *op, int kept, pipe_costs *k) {
    k->n = kept - 1;
    k->seconds = pipe_xcalloc((size_t)kept, sizeof(double)), k->forward = pipe_xcalloc((size_t)kept, sizeof(double));
    k->activation = pipe_xcalloc((size_t)kept, sizeof(double)), k->params = pipe_xcalloc((size_t)kept, sizeof(double));
    k->cross = pipe_xcalloc((size_t)kept, sizeof(double)), k->send_tail = pipe_xcalloc((size_t)kept, sizeof(double));
    k->layer_start = pipe_xcalloc((size_t)kept, 1);
    for (int q = 0; q < kept; q++) {
        const double *row = sums + (size_t)q * SUM_COLUMNS;
        k->seconds[q] = row[SUM_SECONDS], k->forward[q] = row[SUM_FORWARD];
        k->activation[q] = row[SUM_ACTIVATION], k->params[q] = row[SUM_PARAMS];
        /* the crossing into a position is its op's; none into the model's end, nor its start */
        k->cross[q] = q > 0 && op[q] < c->n ? c->cross[op[q]] : 0;
        k->send_tail[q] = op[q] < c->n ? c->send_tail[op[q]] : 0;
        k->layer_start[q] = 1;
    }
    k->layer_starts = kept - 2;
}

/* Stage k of the estimate, over the kept positions [i, j). */
static void estimate_stage(const ir_graph *g, const dm_pipeline_options *opts, const pipe_costs *kc, const double *sums,
                           const double *steps, int stages, int k, int i, int j, dm_stage_estimate *out) {
    const double *from = sums + (size_t)i * SUM_COLUMNS, *to = sums + (size_t)j * SUM_COLUMNS;
    double reduced_here[IR_MAX_AXES];
    for (int a = 0; a < IR_MAX_AXES; a++) reduced_here[a] = to[SUM_REDUCED + a] - from[SUM_REDUCED + a];
    pipe_stage_times(kc, i, j, &out->forward[k], &out->backward[k]);
    /* as the compiled plan times its schedule (time_schedule): a stage of the deep model
     * may hold no op of one kind, and the planner simulates the schedule with these */
    out->forward[k] = pipe_action_seconds(out->forward[k]);
    out->backward[k] = pipe_action_seconds(out->backward[k]);
    out->send[k] = pipe_send_seconds_of(kc, i, out->backward[k]);
    out->update[k] = pipe_update_seconds_of(g, &opts->cost, to[SUM_UPDATE] - from[SUM_UPDATE],
                                       to[SUM_UPDATE_CACHED] - from[SUM_UPDATE_CACHED],
                                       to[SUM_UPDATE_BYTES] - from[SUM_UPDATE_BYTES]) +
                     pipe_reductions_seconds(g, &opts->cost, reduced_here, steps, to[SUM_LINK] - from[SUM_LINK], out->backward[k],
                                        stages, opts->microbatches ? opts->microbatches : g->microbatches, opts->bucket_bytes);
    out->state_bytes[k] = 4.0 * (kc->params[j] - kc->params[i]);
    out->activation_bytes[k] = 4.0 * (kc->activation[j] - kc->activation[i] + kc->cross[i]);
}

int pipeline_estimate_stages(const ir_graph *g, const dm_pipeline_options *opts, const char *group, int64_t layers,
                             int stages, dm_stage_estimate *out) {
    memset(out, 0, sizeof *out);
    /* the probe runs one micro-batch; the plan's gradient sums are its micro-batches' */
    pipe_costs c = {.g = g, .model = &opts->cost, .microbatches = opts->microbatches ? opts->microbatches : g->microbatches};
    pipe_measure_ops(g, &c);
    int a0, n = c.n, status = -1;
    layout l = {.n = n, .layers = layers};
    if (layers < 2 || find_instances(g, &c, group, &a0, &l.a1, &l.a2)) {
        pipe_costs_free(&c);
        return -1;
    }
    l.m = n + (int)((layers - 2) * (l.a2 - l.a1));
    update_costs u;
    measure_update(g, &c, &u);
    /* the cut starts stages at layer starts when there are enough of them (cut_candidates) */
    int all_ops = laid_out_layer_starts(&l, c.layer_start) < stages - 1;
    double *rows = probe_rows(&c, &u);
    int most = all_ops ? l.m + 1 : (int)laid_out_layer_starts(&l, c.layer_start) + 2;
    double *sums = pipe_xcalloc((size_t)most * SUM_COLUMNS, sizeof(double));
    int *op = pipe_xcalloc((size_t)most, sizeof(int));
    int kept = sum_laid_out(&l, rows, c.layer_start, all_ops, sums, op);
    pipe_costs kc = {.g = g, .model = &opts->cost};
    kept_costs(&c, sums, op, kept, &kc);
    int *boundary = pipe_xcalloc((size_t)stages + 1, sizeof(int));
    boundary[1] = kc.n;
    if (l.m >= stages && (stages == 1 || pipe_choose_cuts(&kc, stages, 0, opts->cut_memo, boundary) == 0)) {
        out->stages = stages;
        out->forward = pipe_xcalloc((size_t)stages, sizeof(double));
        out->backward = pipe_xcalloc((size_t)stages, sizeof(double));
        out->update = pipe_xcalloc((size_t)stages, sizeof(double));
        out->send = pipe_xcalloc((size_t)stages, sizeof(double));
        out->state_bytes = pipe_xcalloc((size_t)stages, sizeof(double));
        out->activation_bytes = pipe_xcalloc((size_t)stages, sizeof(double));
        for (int k = 0; k < stages; k++)
            estimate_stage(g, opts, &kc, sums, u.steps, stages, k, boundary[k], boundary[k + 1], out);
        out->model_flops = sums[(size_t)(kept - 1) * SUM_COLUMNS + SUM_FLOPS];
        for (int j = 0; j < n; j++) out->probe_activation_bytes += 4.0 * c.activation[j];
        status = 0;
    }
    free(boundary);
    free(rows), free(sums), free(op);
    pipe_costs_free(&kc);
    update_costs_free(&u);
    pipe_costs_free(&c);
    return status;
}

void dm_stage_estimate_free(dm_stage_estimate *e) {
    free(e->forward);
    free(e->backward);
    free(e->update);
    free(e->send);
    free(e->state_bytes);
    free(e->activation_bytes);
    memset(e, 0, sizeof *e);
}

