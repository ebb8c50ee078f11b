/* pipeline.c: pipeline stages. The forward ops, in program order, are cut into P
 * contiguous stages; every other op follows: a backward op runs where the forward op it
 * differentiates ran (v->origin), an update where its parameter lives (where its gradient
 * is made: the stage of the first op on the loss path reading it, gradient_origin), a
 * collective the shard pass inserted where its operand is.
 *
 * The cut minimises the slowest stage (the pipeline runs at its pace), where a stage's
 * time is its forward ops' predicted time, their backward ops' and receiving the values
 * that cross into it (forward, and their gradients back), by dynamic programming over
 * the boundaries: best[k][j] is the slowest of k stages holding the first j ops. Ties go
 * to the cut moving fewer bytes. A stage must fit the memory limit: its parameters,
 * gradients and optimizer state, plus the activations of the micro-batches it holds at
 * once (M for GPipe, min(P - s, M) for 1F1B). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hardware.h"
#include "passes.h"
#include "schedule.h"
#include "pipeline_costs.h"


void *pipe_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) abort();
    return p;
}

int dm_optimizer_states(const ir_graph *g) {
    if (g->optimizer.kind == OPTIM_ADAMW) return 2;
    return g->optimizer.kind == OPTIM_SGD && g->optimizer.momentum > 0 ? 1 : 0;
}

double dm_state_per_param(int zero, int states, double shares) {
    return (zero >= 3 ? 1 / shares : 1) + (zero >= 2 ? 1 / shares : 1) + states / (zero >= 1 ? shares : 1);
}

/* The ranks ZeRO splits a parameter's state over: the axis named data (1 without ZeRO). */
static double zero_shares(const ir_graph *g) {
    return g->zero > 0 && g->data_axis >= 0 ? (double)g->axes[g->data_axis].size : 1;
}

/* Per-op values (n of them, in an array of n + 1) into sums over the ops before each: v[j]
 * becomes the sum of v[0 .. j). */
static void prefix_sum(double *v, int n) {
    double sum = 0;
    for (int j = 0; j <= n; j++) {
        double here = j < n ? v[j] : 0;
        v[j] = sum;
        sum += here;
    }
}

static int is_forward_op(const ir_value *v) {
    return v->phase == PHASE_FORWARD && ir_op_info_of(v->op)->cls != OPC_SOURCE;
}

/* The forward op whose gradient rule makes parameter p's gradient: autodiff adds a
 * parameter's contributions in reverse program order, so the last, which makes the
 * gradient, is that of the first op on the loss path reading it (through the copy autodiff
 * may add, an identity whose origin is the parameter, and the shard pass's reductions,
 * which have none). NULL where no op's gradient reaches it (its gradient is zeros, or it
 * has none). Not always the parameter's first reader: `dead = x @ w` off the loss path
 * reads w first and makes no gradient. */
static const ir_value *gradient_origin(const ir_graph *g, int p) {
    if (!g->grads || p < 0 || p >= g->n_params || g->grads[p] < 0) return NULL;
    const ir_value *v = g->values[g->grads[p]];
    for (int hops = 0; hops < g->n_values; hops++) {
        if (v->origin && is_forward_op(v->origin)) return v->origin;
        int copies = v->op == OP_IDENTITY || ir_op_info_of(v->op)->cls == OPC_COLLECTIVE;
        if (!copies || v->n_operands < 1) return NULL;
        v = g->values[v->operands[0]];
    }
    return NULL;
}

/* Length of the layer part of a value's name: up to the first member index of a repeated
 * layer, at any depth ("h.3" of "h.3.mlp.c_fc", "model.layers.3" of Hugging Face's
 * "model.layers.3.mlp.down_proj", where the stack is a layer of the model's block), else
 * the first component ("fc1" of "fc1.matmul", "model" of "model.norm.mul"), all of "h1". */
size_t pipe_layer_key(const char *name) {
    const char *first_dot = strchr(name, '.');
    if (!first_dot) return strlen(name);
    for (const char *dot = first_dot; dot; dot = strchr(dot + 1, '.')) {
        const char *p = dot + 1;
        while (*p >= '0' && *p <= '9') p++;
        if (p > dot + 1 && (*p == '.' || *p == 0)) return (size_t)(p - name);
    }
    return (size_t)(first_dot - name);
}

/* The cut goes between layers (the layer stack) where it can: inside one, more values
 * usually cross. An op without a name belongs to the layer before it. */
static void mark_layers(const ir_graph *g, pipe_costs *c) {
    c->layer_start = pipe_xcalloc((size_t)c->n + 1, 1);
    const char *key = NULL;
    size_t key_len = 0;
    for (int j = 0; j < c->n; j++) {
        const char *name = g->values[c->op[j]]->name;
        if (!name) continue;
        size_t len = pipe_layer_key(name);
        if (key && (len != key_len || strncmp(name, key, len) != 0)) {
            c->layer_start[j] = 1;
            c->layer_starts++;
        }
        key = name, key_len = len;
    }
}

/* One element-wise pass over a gradient of elems elements: an operation an element, and
 * bytes_per bytes; f32 whatever the products' precision (the gradients and their sums are). */
static double grad_pass_seconds(const ir_graph *g, const dm_cost_model *m, double elems, double bytes_per) {
    if (elems <= 0) return 0;
    dm_op_cost c = {.flops = elems, .bytes = bytes_per * elems, .calls = 1, .fp32_master = 1};
    return cost_seconds(g, m, c);
}

double pipe_grad_sum_seconds(const ir_graph *g, const dm_cost_model *m, int microbatches, double elems) {
    /* 16-bit plans are costed as Megatron-LM runs them (cost_seconds' 2-byte activations):
     * its weight-gradient products accumulate into the fp32 gradient in place (beta = 1,
     * gradient_accumulation_fusion), no pass of their own. Pricing dmc's add here put the
     * published runs of many micro-batches 6 to 7 points further off (docs/cost.md). */
    if (microbatches <= 1 || (m && (m->precision == DM_BF16 || m->precision == DM_FP16))) return 0;
    return grad_pass_seconds(g, m, elems, dm_runs_pipedream(g) ? 8 : 12);
}

double pipe_grad_mean_seconds(const ir_graph *g, const dm_cost_model *m, int microbatches, double elems) {
    if (microbatches <= 1 || dm_runs_pipedream(g)) return 0;
    return grad_pass_seconds(g, m, elems, 8);
}

/* The elements of parameter p's gradient on a rank (0 when it has none). */
static double grad_elems(const ir_graph *g, int p) {
    int grad = g->grads ? g->grads[p] : -1;
    return grad >= 0 ? (double)ir_local_numel(g, &g->values[grad]->type) : 0;
}

/* Where each value is read, by forward position (n_values entries each). */
typedef struct value_uses {
    int *pos;            /* the value's own forward position, or -1 */
    int *first_use;      /* the first position reading it (n: none) */
    int *last_use;       /* the last (-1: none) */
    char *read_backward; /* a backward op reads it */
    int *first_backward; /* the first position a backward reads it at (n: none) */
} value_uses;

/* Each position's seconds, forward seconds, flops and send tail (the backward ops after the
 * last value sent to an earlier stage), and where every value is read. */
static void time_positions(const ir_graph *g, pipe_costs *c, value_uses *u) {
    const int n = c->n;
    int *where = pipe_xcalloc((size_t)g->n_values, sizeof(int)), *last_sent = pipe_xcalloc((size_t)n + 1, sizeof(int));
    double *op_seconds = pipe_xcalloc((size_t)g->n_values, sizeof(double));
    for (int j = 0; j <= n; j++) last_sent[j] = -1;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        /* where the op runs, as a forward position: its own, or its origin's */
        int at = u->pos[i];
        if (at < 0 && v->origin && u->pos[v->origin->id] >= 0) at = u->pos[v->origin->id];
        where[i] = at;
        if (at < 0) continue;
        dm_op_cost oc = cost_of_op(g, v);
        double t = cost_seconds(g, c->model, oc);
        op_seconds[i] = t;
        c->seconds[at] += t;
        if (v->phase == PHASE_FORWARD) c->forward[at] += t;
        c->flops[at] += oc.flops;
        for (int k = 0; k < v->n_operands; k++) {
            int x = v->operands[k];
            if (at < u->first_use[x]) u->first_use[x] = at;
            if (at > u->last_use[x]) u->last_use[x] = at;
            if (v->phase == PHASE_BACKWARD) {
                u->read_backward[x] = 1;
                if (at < u->first_backward[x]) u->first_backward[x] = at;
            }
            /* a backward value an op of an earlier position reads: sent there by a cut at x's */
            const ir_value *xv = g->values[x];
            if (xv->phase == PHASE_BACKWARD && where[x] > at && x > last_sent[where[x]]) last_sent[where[x]] = x;
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        int at = where[i];
        if (at >= 0 && g->values[i]->phase == PHASE_BACKWARD && last_sent[at] >= 0 && i > last_sent[at])
            c->send_tail[at] += op_seconds[i];
    }
    /* several micro-batches: each adds a parameter's gradient into the step's sum once it is
     * made, in the backward of the parameter's first reader (a layer's weight gradients,
     * which come after the send: the tail); a weight gradient's product makes the sum
     * itself (dm_micro_grads_in_sums): no pass */
    char *in_sum = dm_micro_grads_in_sums(g);
    for (int p = 0; c->microbatches > 1 && p < g->n_params; p++) {
        int at = u->first_use[g->params[p]];
        if (at >= n || in_sum[p]) continue;
        double t = pipe_grad_sum_seconds(g, c->model, c->microbatches, grad_elems(g, p));
        c->seconds[at] += t;
        c->send_tail[at] += t;
    }
    free(in_sum);
    free(where);
    free(last_sent);
    free(op_seconds);
}

/* The backward reading a reshape or view reads its operand's buffer: counted once, as the
 * operand's (gpt.dm's merged heads are a reshape of the attention's output, which the
 * attention's backward reads too). So does a parameter's window that pass_slice_views,
 * which runs after the cut, will read in place: gpt.dm's c_attn q/k/v weight windows, 27
 * MiB a micro-batch of GPT-2 124M's stages counted as activations the memory plan does not
 * have (dm_slice_reads_in_place: cost.c counts them alike). */
static void backward_reads_through_views(const ir_graph *g, value_uses *u) {
    for (int i = g->n_values - 1; i >= 0; i--)
        if (u->read_backward[i] && (ir_in_operand_buffer(g->values[i]) || dm_slice_reads_in_place(g, g->values[i]))) {
            int x = g->values[i]->operands[0];
            u->read_backward[x] = 1;
            if (u->first_backward[i] < u->first_backward[x]) u->first_backward[x] = u->first_backward[i];
            u->read_backward[i] = 0;
        }
}

/* Each position's parameter state and kept activations, the values crossing each
 * boundary, and those a later stage keeps for its backward (kept_across). */
static void measure_memory(const ir_graph *g, pipe_costs *c, const value_uses *u) {
    const int n = c->n;
    /* parameters, gradients and optimizer state, ZeRO's shares of them */
    double state = dm_state_per_param(g->zero, dm_optimizer_states(g), zero_shares(g));
    /* a value made from numbers alone is made once, at create (passes/hoist_constants.c):
     * no micro-batch keeps a copy of it (RoPE's tables) */
    char *constant = dm_constant_values(g);
    double *delta = pipe_xcalloc((size_t)n + 2, sizeof(double)), *across = pipe_xcalloc((size_t)n + 2, sizeof(double));
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op == OP_PARAM && u->first_use[i] < n) {
            /* on the stage that makes its gradient and updates it (place_the_rest) */
            const ir_value *o = gradient_origin(g, v->param_index);
            int at = o && u->pos[o->id] >= 0 ? u->pos[o->id] : u->first_use[i];
            c->params[at] += (double)ir_local_numel(g, &v->type) * state;
        }
        const int at = u->pos[i];
        if (at < 0 || v->type.dtype == DT_VOID || u->last_use[i] <= at) continue;
        double elems = (double)ir_storage_elems(g, v);
        /* it crosses every boundary after it up to its last user */
        delta[at + 1] += elems;
        delta[u->last_use[i] + 1] -= elems;
        if (u->read_backward[i] && !constant[i]) {
            c->activation[at] += elems;
            /* a stage's last output that only the next stage's backward reads is kept there,
             * received, and not by its maker (memory_stages.c): across boundaries pos + 1 ..
             * its first backward reader's */
            if (u->first_backward[i] > at && u->first_backward[i] < n) {
                across[at + 1] += elems;
                across[u->first_backward[i] + 1] -= elems;
            }
        }
    }
    free(constant);
    c->kept_across = pipe_xcalloc((size_t)n + 1, sizeof(double));
    double kept_run = 0, run = 0;
    for (int j = 0; j <= n; j++) c->kept_across[j] = (kept_run += across[j]);
    c->kept_across[0] = c->kept_across[n] = 0;
    for (int j = 0; j <= n; j++) c->cross[j] = (run += delta[j]);
    c->cross[0] = c->cross[n] = 0;
    free(across);
    free(delta);
}

/* Each forward op's costs, its own (not yet summed), the values crossing each boundary and
 * where layers start. */
void pipe_measure_ops(const ir_graph *g, pipe_costs *c) {
    int n = 0;
    value_uses u = {.pos = pipe_xcalloc((size_t)g->n_values, sizeof(int)),
                    .first_use = pipe_xcalloc((size_t)g->n_values, sizeof(int)),
                    .last_use = pipe_xcalloc((size_t)g->n_values, sizeof(int)),
                    .read_backward = pipe_xcalloc((size_t)g->n_values, 1),
                    .first_backward = pipe_xcalloc((size_t)g->n_values, sizeof(int))};
    c->op = pipe_xcalloc((size_t)g->n_values, sizeof(int));
    for (int i = 0; i < g->n_values; i++) {
        u.pos[i] = -1;
        if (is_forward_op(g->values[i])) u.pos[i] = n, c->op[n++] = i;
    }
    c->n = n;
    for (int i = 0; i < g->n_values; i++) u.first_use[i] = n, u.last_use[i] = -1, u.first_backward[i] = n;
    c->seconds = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->forward = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->flops = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->activation = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->params = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->cross = pipe_xcalloc((size_t)n + 1, sizeof(double));
    c->send_tail = pipe_xcalloc((size_t)n + 1, sizeof(double));
    time_positions(g, c, &u);
    backward_reads_through_views(g, &u);
    measure_memory(g, c, &u);
    mark_layers(g, c);
    free(u.pos);
    free(u.first_use);
    free(u.last_use);
    free(u.read_backward);
    free(u.first_backward);
}

/* Per op (at j) into sums over the ops before j. */
static void sum_costs(pipe_costs *c) {
    double *per_op[] = {c->seconds, c->forward, c->flops, c->activation, c->params};
    for (size_t a = 0; a < sizeof per_op / sizeof per_op[0]; a++) prefix_sum(per_op[a], c->n);
}

static void measure(const ir_graph *g, pipe_costs *c) {
    pipe_measure_ops(g, c);
    sum_costs(c);
}

void pipe_costs_free(pipe_costs *c) {
    free(c->op);
    free(c->seconds);
    free(c->forward);
    free(c->flops);
    free(c->activation);
    free(c->params);
    free(c->cross);
    free(c->kept_across);
    free(c->send_tail);
    free(c->layer_start);
    free(c->in_flight);
}

/* Receiving the inputs of a stage starting at op i from the stage before, over the
 * pipeline axis. */
static double recv_seconds(const pipe_costs *c, int i) {
    return cost_link_seconds(c->g, c->model, c->g->pipe_axis, 4.0 * c->cross[i]);
}

/* A stage holding ops [i, j): its time (with the activations crossing in and their
 * gradients crossing back), and its bytes as stage k (state, and the activations of the
 * micro-batches in flight). */
static double stage_seconds(const pipe_costs *c, int i, int j) {
    return c->seconds[j] - c->seconds[i] + 2 * recv_seconds(c, i);
}

/* Its two parts: the activations' arrival counts to the forward, their gradients' return
 * to the backward. */
void pipe_stage_times(const pipe_costs *c, int i, int j, double *forward, double *backward) {
    *forward = c->forward[j] - c->forward[i] + recv_seconds(c, i);
    *backward = stage_seconds(c, i, j) - *forward;
}

/* How far into the backward of a stage starting at op i its inputs' gradient leaves: all
 * but what op i's backward computes after it (the first stage sends nothing: its whole
 * backward). */
double pipe_send_seconds_of(const pipe_costs *c, int i, double backward) {
    double send = i > 0 ? backward - c->send_tail[i] : backward;
    return send > 1e-12 && send <= backward ? send : backward;
}

/* The activations a stage of ops [i, j) keeps per micro-batch that it made (its received
 * ones are cross[i]): each value once, on the stage whose backward reads it. kept_across[j]
 * also holds values made before i that pass the whole stage to a later backward: cross[i]
 * counts those and this subtracts them, so they cancel (the stage holds none: a value is
 * sent to the stage that reads it). */
static double stage_activation(const pipe_costs *c, int i, int j) {
    double made = c->activation[j] - c->activation[i] - (c->kept_across ? c->kept_across[j] : 0);
    return made > 0 ? made : 0;
}

static double stage_bytes(const pipe_costs *c, int k, int i, int j) {
    return 4.0 * (c->params[j] - c->params[i] + (stage_activation(c, i, j) + c->cross[i]) * c->in_flight[k]);
}

/* Where a stage may start: between layers when there are enough of them, else at any
 * op; 0 and n always. Returns the count, positions in cand (n + 1 room). The search is
 * quadratic in these, so cutting at layers only (a GPT's L + 3) keeps it fast for deep
 * models. */
static int cut_candidates(const pipe_costs *c, int stages, int *cand) {
    int layers_only = c->layer_starts >= stages - 1, m = 0;
    for (int j = 0; j <= c->n; j++)
        if (j == 0 || j == c->n || !layers_only || c->layer_start[j]) cand[m++] = j;
    return m;
}

/* The cut search's tables: best[k][b], the slowest stage of the best cut of ops
 * [0, cand[b]) into k + 1 stages; moved[k][b], the bytes its cuts move; from[k][b], the
 * candidate its last stage starts at. Only the cells a whole cut can pass through are
 * kept: stage k ends at least k candidates in and leaves one for each stage after it, so
 * row k holds b in [k, k + w) with w = m - stages + 1. */
typedef struct cut_search {
    const pipe_costs *c;
    const int *cand;
    int w;
    double limit;
    double *best, *moved, *recv2;  /* recv2[a]: a stage starting at cand[a] receiving, both ways */
    double *seconds, *cross;       /* c's at each candidate: the scans read them contiguously */
    double *floor;                 /* floor[a]: the least of row k - 1 from a on */
    double *reach;                 /* reach[z]: the most of seconds[cand[x]] - recv2[x] over x < z */
    int *from;
    int sorted;                    /* seconds[] never falls over the candidates, nor recv2 below 0 */
} cut_search;

#define AT(s, k, b) ((size_t)(k) * (size_t)(s)->w + (size_t)((b) - (k)))

/* The slowest stage of the cut ending with stage k over [cand[a], cand[b]), or DBL_MAX
 * when the cut before it does not exist or the stage does not fit the limit. */
static inline double cut_time(const cut_search *s, int k, int a, int b) {
    double before = s->best[AT(s, k - 1, a)];
    if (before == DBL_MAX || (s->limit && stage_bytes(s->c, k, s->cand[a], s->cand[b]) > s->limit)) return DBL_MAX;
    double t = s->seconds[b] - s->seconds[a] + s->recv2[a];   /* stage_seconds(c, cand[a], cand[b]) */
    return t < before ? before : t;
}

/* Whether the scan for cell (k, b) may start at candidate z > k without changing its
 * outcome: when z's time is below every earlier start's by more than the rounding the
 * scan forgives, so that z replaces whichever start the scan held, and the scan from z
 * ends as the scan from k does. An earlier start x takes at least seconds[j] -
 * seconds[cand[x]] + recv2[x], so at least seconds[j] - reach[z]; the margin (1e-13 of
 * seconds[j]) covers the rounding of those sums, each within 1e-16 of the exact one when
 * seconds[] is sorted and recv2 not negative. */
static int may_start(const cut_search *s, int k, int z, int b) {
    double t = cut_time(s, k, z, b), total = s->seconds[b];
    return t != DBL_MAX && t < (total - s->reach[z] - 1e-13 * total) * (1 - 2e-9);
}

/* The latest start that may_start allows at or before `guess` (where cell (k, b - 1)'s
 * last stage starts: the best starts move right with b), else k. */
static int first_start(const cut_search *s, int k, int b, int guess) {
    if (!s->sorted) return k;
    int z = guess;
    while (z > k && !may_start(s, k, z, b)) z--;
    return z > k ? z : k;
}

/* Cell (k, b) as the scan over every start a in [k, b) fills it, from first_start on and
 * up to the first start from which every later one is slower than the best found by more
 * than the rounding forgiven (floor[]: none of them can then be chosen; with seconds[]
 * sorted no time is below 0, where that would not hold). */
static void cut_cell(cut_search *s, int k, int b, int guess) {
    /* row k - 1 by candidate, and what the scan reads of it, in locals: the scan is the
     * planner's innermost loop */
    const double *prior = s->best + AT(s, k - 1, k - 1) - (k - 1), *prior_moved = s->moved + AT(s, k - 1, k - 1) - (k - 1);
    const double *seconds = s->seconds, *recv2 = s->recv2, *cross = s->cross, *floor = s->floor;
    double end = seconds[b], limit = s->limit, best = DBL_MAX, moved = 0;
    int from = -1, sorted = s->sorted;
    for (int a = first_start(s, k, b, guess); a < b; a++) {
        if (sorted && floor[a] > best * (1 + 1e-9)) break;
        /* cut_time(s, k, a, b) */
        double before = prior[a];
        if (before == DBL_MAX || (limit && stage_bytes(s->c, k, s->cand[a], s->cand[b]) > limit)) continue;
        double t = end - seconds[a] + recv2[a];
        if (t < before) t = before;
        if (t == DBL_MAX) continue;
        double moved_here = prior_moved[a] + cross[a];
        /* equal within rounding: the cut moving fewer bytes */
        int better = t < best * (1 - 1e-9) || (t <= best * (1 + 1e-9) && moved_here < moved);
        if (better) best = t, moved = moved_here, from = a;
    }
    s->best[AT(s, k, b)] = best, s->moved[AT(s, k, b)] = moved, s->from[AT(s, k, b)] = from;
}

/* The search's view of its candidates: each one's sum of seconds, crossing and receiving,
 * and the bounds the scans use. */
static void cut_search_init(cut_search *s, const pipe_costs *c, const int *cand, int m, int stages, double limit) {
    *s = (cut_search){.c = c, .cand = cand, .w = m - stages + 1, .limit = limit, .sorted = 1};
    s->recv2 = pipe_xcalloc((size_t)m, sizeof(double));
    s->seconds = pipe_xcalloc((size_t)m, sizeof(double)), s->cross = pipe_xcalloc((size_t)m, sizeof(double));
    s->floor = pipe_xcalloc((size_t)m + 1, sizeof(double)), s->reach = pipe_xcalloc((size_t)m + 1, sizeof(double));
    /* a stage's receiving depends on its start only: priced once per candidate */
    for (int a = 0; a < m; a++) {
        s->seconds[a] = c->seconds[cand[a]], s->cross[a] = c->cross[cand[a]];
        s->recv2[a] = 2 * recv_seconds(c, cand[a]);
        if (s->recv2[a] < 0 || (a && c->seconds[cand[a]] < c->seconds[cand[a - 1]])) s->sorted = 0;
        double reach = c->seconds[cand[a]] - s->recv2[a];
        s->reach[a + 1] = a && s->reach[a] > reach ? s->reach[a] : reach;
    }
}

static void cut_search_free(cut_search *s) {
    free(s->best);
    free(s->moved);
    free(s->from);
    free(s->recv2);
    free(s->seconds);
    free(s->cross);
    free(s->floor);
    free(s->reach);
}

/* Fills best[][] row by row; the candidates the stages of the best cut start at into
 * starts (stages + 1, the end last). Returns 0, or -1 when no cut fits the limit. */
static int cut_search_run(cut_search *s, int stages, int *starts) {
    const pipe_costs *c = s->c;
    const int *cand = s->cand;
    int w = s->w, m = w + stages - 1;
    size_t cells = (size_t)stages * (size_t)w;
    s->best = pipe_xcalloc(cells, sizeof(double)), s->moved = pipe_xcalloc(cells, sizeof(double));
    s->from = pipe_xcalloc(cells, sizeof(int));
    for (size_t q = 0; q < cells; q++) s->best[q] = DBL_MAX, s->from[q] = -1;
    for (int b = 1; b <= m - stages; b++)
        if (!s->limit || stage_bytes(c, 0, 0, cand[b]) <= s->limit) s->best[AT(s, 0, b)] = stage_seconds(c, 0, cand[b]);
    for (int k = 1; k < stages; k++) {
        s->floor[k - 1 + w] = DBL_MAX;
        for (int a = k - 2 + w; a >= k - 1; a--) {
            double v = s->best[AT(s, k - 1, a)];
            s->floor[a] = v < s->floor[a + 1] ? v : s->floor[a + 1];
        }
        for (int b = k + 1; b < k + w; b++) cut_cell(s, k, b, s->from[AT(s, k, b - 1)]);
    }
    if (!(s->best[AT(s, stages - 1, m - 1)] < DBL_MAX)) return -1;
    starts[stages] = m - 1;
    for (int k = stages - 1; k > 0; k--) starts[k] = s->from[AT(s, k, starts[k + 1])];
    starts[0] = 0;
    return 0;
}

/* ---- The planner's cut searches, remembered (dm_cut_memo) ----
 * Probes of one mesh that differ only where the cut does not look (ZeRO's shares of the
 * optimizer state, of the gradients) search the same cut: a third of the 1T GPT's
 * searches repeat one of the few before them. Without a memory limit a search reads its
 * candidates' seconds, receiving and crossing only, so equal ones choose equal cuts. */
enum { CUT_MEMO_ENTRIES = 16 };

typedef struct cut_memo_entry {
    uint64_t hash;
    int stages, m;
    double *inputs;     /* (3 m) the candidates' seconds, then receiving, then crossing */
    int *starts;        /* (stages + 1) cut_search_run's; NULL when no cut was found */
} cut_memo_entry;

struct dm_cut_memo {
    cut_memo_entry entry[CUT_MEMO_ENTRIES];
    int next;           /* the entry replaced next, the oldest */
};

dm_cut_memo *dm_cut_memo_new(void) { return pipe_xcalloc(1, sizeof(dm_cut_memo)); }

void dm_cut_memo_free(dm_cut_memo *memo) {
    if (!memo) return;
    for (int e = 0; e < CUT_MEMO_ENTRIES; e++) free(memo->entry[e].inputs), free(memo->entry[e].starts);
    free(memo);
}

/* What a search without a limit reads, packed for comparison, and a hash of it (FNV-1a
 * over its doubles' bits). */
static double *cut_inputs(const cut_search *s, int m, uint64_t *hash) {
    double *in = pipe_xcalloc(3 * (size_t)m, sizeof(double));
    memcpy(in, s->seconds, (size_t)m * sizeof(double));
    memcpy(in + m, s->recv2, (size_t)m * sizeof(double));
    memcpy(in + 2 * m, s->cross, (size_t)m * sizeof(double));
    uint64_t h = 14695981039346656037u;
    for (size_t i = 0; i < 3 * (size_t)m; i++) {
        uint64_t bits;
        memcpy(&bits, &in[i], sizeof bits);
        h = (h ^ bits) * 1099511628211u;
    }
    *hash = h;
    return in;
}

static const cut_memo_entry *memo_find(const dm_cut_memo *memo, uint64_t hash, int stages, int m, const double *in) {
    for (int e = 0; e < CUT_MEMO_ENTRIES; e++) {
        const cut_memo_entry *x = &memo->entry[e];
        if (x->inputs && x->hash == hash && x->stages == stages && x->m == m &&
            memcmp(x->inputs, in, 3 * (size_t)m * sizeof(double)) == 0)
            return x;
    }
    return NULL;
}

/* Keeps a search (its inputs owned by the memo from now on), in place of the oldest. */
static void memo_keep(dm_cut_memo *memo, uint64_t hash, int stages, int m, double *in, const int *starts) {
    cut_memo_entry *x = &memo->entry[memo->next];
    memo->next = (memo->next + 1) % CUT_MEMO_ENTRIES;
    free(x->inputs), free(x->starts);
    *x = (cut_memo_entry){.hash = hash, .stages = stages, .m = m, .inputs = in};
    if (starts) {
        x->starts = pipe_xcalloc((size_t)stages + 1, sizeof(int));
        memcpy(x->starts, starts, ((size_t)stages + 1) * sizeof(int));
    }
}

/* The best cut into `stages` stages, by best[][], looked up in memo first when there is one
 * and no limit. Returns -1 when no cut fits the limit. */
int pipe_choose_cuts(const pipe_costs *c, int stages, double limit, dm_cut_memo *memo, int *boundary) {
    int *cand = pipe_xcalloc((size_t)c->n + 1, sizeof(int));
    int m = cut_candidates(c, stages, cand);
    if (m - stages + 1 < 2) {
        free(cand);
        return -1;
    }
    cut_search s;
    cut_search_init(&s, c, cand, m, stages, limit);
    int *starts = pipe_xcalloc((size_t)stages + 1, sizeof(int)), status;
    if (memo && !limit) {
        uint64_t hash;
        double *in = cut_inputs(&s, m, &hash);
        const cut_memo_entry *seen = memo_find(memo, hash, stages, m, in);
        if (seen) {
            status = seen->starts ? 0 : -1;
            if (seen->starts) memcpy(starts, seen->starts, ((size_t)stages + 1) * sizeof(int));
            free(in);
        } else {
            status = cut_search_run(&s, stages, starts);
            memo_keep(memo, hash, stages, m, in, status ? NULL : starts);
        }
    } else {
        status = cut_search_run(&s, stages, starts);
    }
    for (int k = 0; !status && k <= stages; k++) boundary[k] = cand[starts[k]];
    free(starts);
    cut_search_free(&s);
    free(cand);
    return status;
}
#undef AT

/* Stages of everything but the forward ops, which have theirs. */
static void place_the_rest(ir_graph *g, dm_pipeline_plan *plan) {
    int *low = pipe_xcalloc((size_t)g->n_values, sizeof(int)), *high = pipe_xcalloc((size_t)g->n_values, sizeof(int));
    for (int i = 0; i < g->n_values; i++) low[i] = plan->stages, high[i] = -1;
    /* sources first, from their forward users: parameters are where the model uses them */
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (!is_forward_op(v)) continue;
        for (int k = 0; k < v->n_operands; k++) {
            int x = v->operands[k];
            if (v->stage < low[x]) low[x] = v->stage;
            if (v->stage > high[x]) high[x] = v->stage;
        }
    }
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (ir_op_info_of(v->op)->cls == OPC_SOURCE && v->phase == PHASE_FORWARD) v->stage = low[i] < plan->stages ? low[i] : 0;
        /* a parameter lives where its gradient is made (the stage of the first op on the loss
         * path reading it: the last the backward pass reaches), which sums it and updates it;
         * a stage reading it before, off the loss path, holds a copy (tied) */
        const ir_value *o = v->op == OP_PARAM ? gradient_origin(g, v->param_index) : NULL;
        if (o) v->stage = o->stage;
        if (v->op == OP_PARAM && (high[i] > low[i] || (high[i] >= 0 && v->stage != low[i]))) {
            plan->tied = realloc(plan->tied, (size_t)(plan->n_tied + 1) * sizeof(int));
            plan->tied_on = realloc(plan->tied_on, (size_t)(plan->n_tied + 1) * sizeof(uint64_t));
            if (!plan->tied || !plan->tied_on) abort();
            plan->tied_on[plan->n_tied] = 0;
            plan->tied[plan->n_tied++] = i;
        }
    }
    /* backward and update ops in order: their origin's stage, a parameter's, an operand's */
    for (int i = 0; i < g->n_values; i++) {
        ir_value *v = g->values[i];
        if (v->phase == PHASE_FORWARD) continue;
        if (v->origin) {
            v->stage = v->origin->stage;
        } else if (v->op == OP_STATE) {
            continue; /* its update's, below */
        } else {
            v->stage = 0;
            for (int k = 0; k < v->n_operands; k++) {
                const ir_value *x = g->values[v->operands[k]];
                if (x->role != ROLE_CONST) {
                    v->stage = x->stage;
                    break;
                }
            }
        }
        if (ir_op_info_of(v->op)->cls == OPC_UPDATE)
            for (int k = 2; k < v->n_operands; k++) g->values[v->operands[k]]->stage = v->stage;
    }
    for (int t = 0; t < plan->n_tied; t++)
        for (int i = 0; i < g->n_values; i++) {
            const ir_value *v = g->values[i];
            if (!is_forward_op(v) || v->stage >= 64) continue;
            for (int k = 0; k < v->n_operands; k++)
                if (v->operands[k] == plan->tied[t]) plan->tied_on[t] |= (uint64_t)1 << v->stage;
        }
    free(low);
    free(high);
}

static void summarise(const ir_graph *g, const pipe_costs *c, const int *boundary, dm_pipeline_plan *plan) {
    double total = 0, slowest = 0;
    for (int k = 0; k < plan->stages; k++) {
        dm_stage_plan *s = &plan->stage[k];
        int i = boundary[k], j = boundary[k + 1];
        s->first = c->op[i];
        s->last = c->op[j - 1];
        s->seconds = stage_seconds(c, i, j);
        pipe_stage_times(c, i, j, &s->forward_seconds, &s->backward_seconds);
        s->send_seconds = pipe_send_seconds_of(c, i, s->backward_seconds);
        s->flops = c->flops[j] - c->flops[i];
        s->activation_elems = (int64_t)stage_activation(c, i, j);
        s->recv_elems = (int64_t)c->cross[i];
        s->in_flight = c->in_flight[k];
        total += s->seconds;
        if (s->seconds > slowest) slowest = s->seconds;
    }
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op == OP_PARAM) plan->stage[v->stage].param_elems += ir_local_numel(g, &v->type);
    }
    plan->imbalance = total > 0 ? slowest / (total / plan->stages) : 1;
}

/* Model flops as Megatron-LM counts them: products forward and backward, not recomputed
 * copies. */
double pipe_model_flops_of(const ir_value *v, const dm_op_cost *oc) {
    return oc->matmul && v->phase != PHASE_UPDATE && !(v->phase == PHASE_BACKWARD && v->segment > 0) ? oc->flops : 0;
}

/* An update-phase op's time, its reduction's latency left out: the bytes it reduces go to
 * reduced[axis], and the ring steps of one reduction to steps[axis] (reductions_seconds pays
 * them per bucket). Its time with its bytes in cache is added to *cached_seconds, and the
 * bytes it moves to *bytes (the update's working set, whose share in cache decides between
 * the two: update_seconds_of). The gradient of a parameter ZeRO 3 holds in shares
 * (in_shares) is reduce-scattered and the update all-gathers nothing (passes/zero.c): half
 * the allreduce's ring, (n - 1) / n of the bytes in n - 1 steps. ZeRO 1 and 2's
 * reduce-scatter and all-gather send what the allreduce sends; a 16-bit reduce-scatter
 * (--compress bf16|fp16) half its part. */
double pipe_update_op_seconds(const ir_graph *g, const dm_cost_model *m, const ir_value *v, const char *in_shares,
                              double *reduced, double *steps, double *link_seconds, double *cached_seconds,
                              double *bytes) {
    dm_op_cost oc = cost_of_op(g, v);
    int shares = in_shares && v->op == OP_ALLREDUCE && v->param_index >= 0 && v->param_index < g->n_params &&
                 in_shares[v->param_index] && g->grads && g->grads[v->param_index] == v->id;
    if (shares) oc.sent /= 2, oc.messages /= 2;
    /* --compress bf16|fp16 under ZeRO: the reduce-scatter (half the allreduce's bytes) in 16
     * bits; ZeRO 1 and 2's all-gather of the parameters stays f32 */
    if (dm_zero_half_reduction(g, v)) oc.sent *= shares ? 0.5 : 0.75;
    if (oc.messages > 0) {
        reduced[oc.axis] += 4.0 * (double)ir_local_numel(g, &g->values[v->operands[0]]->type);
        if (oc.messages > steps[oc.axis]) steps[oc.axis] = oc.messages;
        oc.messages = 0;
    }
    double t = cost_seconds(g, m, oc);
    if (oc.sent > 0) {
        dm_op_cost local = oc;
        local.sent = 0;
        *link_seconds += t - cost_seconds(g, m, local);
    }
    oc.in_cache = 1;
    *cached_seconds += cost_seconds(g, m, oc);
    *bytes += oc.bytes;
    return t;
}

/* A rank's update ops over `bytes`: the share of them that stays in its cache between steps
 * (the parameters, gradients and optimizer state the update streams through, which the
 * forward and backward passes touched) runs at the cache's bandwidth, the rest at the
 * memory's; seconds and cached: the ops' times with every byte in memory, in cache. */
double pipe_update_seconds_of(const ir_graph *g, const dm_cost_model *m, double seconds, double cached,
                              double bytes) {
    double share = cost_cached_share(g, m, bytes);
    return (1 - share) * seconds + share * cached;
}

/* What the update's reductions add to the update ops' own time (update_op_seconds): their
 * latency, bucket by bucket (passes/buckets.c), each paying its ring steps' latency once;
 * less what the backward pass hides of them where buckets start during it, as far as the
 * hardware overlaps the two (the bucket completed last, the first parameters', at most a
 * bucket, cannot hide). reduced and steps by mesh axis; link_seconds: the reductions'
 * bandwidth time; backward: the pass's. */
double pipe_reductions_seconds(const ir_graph *g, const dm_cost_model *m, const double *reduced, const double *steps,
                               double link_seconds, double backward, int stages, int microbatches,
                               double bucket_bytes) {
    double bucket = bucket_bytes > 0 ? bucket_bytes : 4.0 * (double)DM_BUCKET_FLOATS, latency = 0, bytes = 0;
    for (int a = 0; a < g->n_axes; a++) {
        latency += ceil(reduced[a] / bucket) * steps[a] * cost_axis_link(g, m, a)->latency;
        bytes += reduced[a];
    }
    double overlap = cost_hardware(m)->overlap;
    if (overlap <= 0 || bytes <= 0 || !dm_buckets_start_in_backward(g, stages, microbatches)) return latency;
    double reductions = link_seconds + latency;
    double hideable = reductions - reductions * (bucket < bytes ? bucket / bytes : 1);
    return latency - overlap * (hideable < backward ? hideable : backward);
}

/* The update phase of the slowest rank (ranks of a stage run theirs at once; a rank runs
 * its chunks' one after the other), and the model flops of a rank, the mean over them. */
static void predict_update(const ir_graph *g, dm_pipeline_plan *plan, double bucket_bytes) {
    int P = plan->stages;
    double *update = pipe_xcalloc((size_t)P, sizeof(double)), *flops = pipe_xcalloc((size_t)P, sizeof(double));
    /* per stage and mesh axis: bytes reduced in the update, ring steps of one reduction */
    double *reduced = pipe_xcalloc((size_t)P * IR_MAX_AXES, sizeof(double)), *steps = pipe_xcalloc((size_t)P * IR_MAX_AXES, sizeof(double));
    double *link = pipe_xcalloc((size_t)P, sizeof(double));
    double *cached = pipe_xcalloc((size_t)P, sizeof(double)), *bytes = pipe_xcalloc((size_t)P, sizeof(double));
    char *in_shares = dm_zero_gathered_params(g);
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->stage < 0 || v->stage >= P) continue;
        size_t at = (size_t)v->stage * IR_MAX_AXES;
        if (v->phase == PHASE_UPDATE)
            update[v->stage] += pipe_update_op_seconds(g, &plan->cost, v, in_shares, reduced + at, steps + at,
                                                       &link[v->stage], &cached[v->stage], &bytes[v->stage]);
        else {
            dm_op_cost oc = cost_of_op(g, v);
            flops[v->stage] += pipe_model_flops_of(v, &oc);
        }
    }
    /* a rank's chunks share its cache */
    double *by_rank = pipe_xcalloc((size_t)plan->ranks, sizeof(double)), *rank_bytes = pipe_xcalloc((size_t)plan->ranks, sizeof(double));
    for (int k = 0; k < P; k++) rank_bytes[dm_rank_of_stage(plan, k)] += bytes[k];
    /* several micro-batches: the mean of each stage's gradient sums, before its update */
    double *mean = pipe_xcalloc((size_t)P, sizeof(double));
    for (int p = 0; g->microbatches > 1 && p < g->n_params; p++) {
        int st = g->values[g->params[p]]->stage;
        if (st >= 0 && st < P) mean[st] += pipe_grad_mean_seconds(g, &plan->cost, g->microbatches, grad_elems(g, p));
    }
    for (int k = 0; k < P; k++) {
        size_t at = (size_t)k * IR_MAX_AXES;
        update[k] = pipe_update_seconds_of(g, &plan->cost, update[k], cached[k], rank_bytes[dm_rank_of_stage(plan, k)]) +
                    mean[k];
        update[k] += pipe_reductions_seconds(g, &plan->cost, reduced + at, steps + at, link[k], plan->stage[k].backward_seconds,
                                        P, g->microbatches, bucket_bytes);
        /* pipedream updates after every backward: M updates a step, priced as if they
         * delayed the step by their sum (they run between a stage's actions) */
        if (dm_runs_pipedream(g)) update[k] *= g->microbatches;
        by_rank[dm_rank_of_stage(plan, k)] += update[k];
        plan->model_flops += flops[k] * g->microbatches / plan->ranks;
    }
    for (int r = 0; r < plan->ranks; r++)
        if (by_rank[r] > plan->update_seconds) plan->update_seconds = by_rank[r];
    free(by_rank);
    free(rank_bytes);
    free(mean);
    free(in_shares);
    free(cached);
    free(bytes);
    free(reduced);
    free(steps);
    free(link);
    free(update);
    free(flops);
}

/* A stage's time for one action as the schedule simulation takes it: a stage with none of
 * one kind gets a token time, as the simulation needs every action to take some. */
double pipe_action_seconds(double seconds) { return seconds > 1e-12 ? seconds : 1e-12; }

/* The schedule timed with each stage's own predicted times, then the step: the schedule
 * and the update. */
static void time_schedule(const ir_graph *g, dm_pipeline_plan *plan, double bucket_bytes) {
    int S = plan->stages;
    double *forward = pipe_xcalloc((size_t)S, sizeof(double)), *backward = pipe_xcalloc((size_t)S, sizeof(double));
    double *send = pipe_xcalloc((size_t)S, sizeof(double));
    for (int k = 0; k < S; k++) {
        forward[k] = pipe_action_seconds(plan->stage[k].forward_seconds);
        backward[k] = pipe_action_seconds(plan->stage[k].backward_seconds);
        /* (send_seconds <= backward_seconds; a stage of no backward has a token one) */
        send[k] = plan->stage[k].send_seconds > 0 ? plan->stage[k].send_seconds : backward[k];
    }
    if (pipe_schedule_build_sends(&plan->timed, pipe_kind_for(g->schedule, plan->ranks), plan->ranks, plan->chunks,
                                  g->microbatches, forward, backward, send))
        abort();
    free(send);
    plan->bubble = pipe_bubble(&plan->timed);
    predict_update(g, plan, bucket_bytes);
    plan->step_seconds = plan->timed.step + plan->update_seconds;
    free(forward);
    free(backward);
}

/* ZeRO 3's gathers (passes/zero_gather.c, after this pass) in each stage's forward and
 * backward: each an all-gather over its axis (cost.c), run once per micro-batch before the
 * first reader of its bucket. The gather of the next bucket is started after the current
 * one's views, so that it runs during the current bucket's computation: where the hardware
 * overlaps communication with computation (efficiency.overlap), that share of min(the
 * gathers but the phase's first, the phase's computation) is hidden, as the update's
 * buckets are (pipe_reductions_seconds). Then the schedule and the update again. */
void pipeline_retime_zero_gathers(const ir_graph *g, dm_pipeline_plan *plan, double bucket_bytes) {
    if (!plan->timed.actions || !plan->stage) return;
    int S = plan->stages;
    double *gathers = pipe_xcalloc((size_t)S * 2, sizeof(double)), *first = pipe_xcalloc((size_t)S * 2, sizeof(double));
    int any = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ZERO_GATHER || v->stage < 0 || v->stage >= S || v->phase == PHASE_UPDATE) continue;
        size_t at = (size_t)v->stage * 2 + (v->phase == PHASE_BACKWARD);
        double t = cost_seconds(g, &plan->cost, cost_of_op(g, v));
        if (gathers[at] == 0) first[at] = t;
        gathers[at] += t;
        any = 1;
    }
    if (any) {
        double overlap = cost_hardware(&plan->cost)->overlap;
        for (int k = 0; k < S; k++) {
            dm_stage_plan *s = &plan->stage[k];
            double added[2];
            for (int b = 0; b < 2; b++) {
                double total = gathers[2 * k + b], hideable = total - first[2 * k + b];
                double compute = b ? s->backward_seconds : s->forward_seconds;
                added[b] = total - overlap * (hideable < compute ? hideable : compute);
            }
            s->forward_seconds += added[0];
            s->backward_seconds += added[1];
            s->seconds += added[0] + added[1];
            /* the backward's gathers precede its send (the first layer's weights' gradients
             * come last) */
            if (s->send_seconds > 0) s->send_seconds += added[1];
        }
        pipe_schedule_free(&plan->timed);
        plan->update_seconds = plan->model_flops = 0;
        time_schedule(g, plan, bucket_bytes);
    }
    free(gathers);
    free(first);
}

int pass_pipeline(ir_graph *g, const dm_pipeline_options *opts, dm_pipeline_plan *plan, dm_diag *d) {
    memset(plan, 0, sizeof *plan);
    int ranks = g->pipe_axis >= 0 ? (int)g->axes[g->pipe_axis].size : 1, chunks = pipeline_chunks(g, ranks, d);
    if (chunks < 0) return 1;
    int stages = ranks * chunks;
    plan->stages = stages, plan->ranks = ranks, plan->chunks = chunks;
    plan->stage = pipe_xcalloc((size_t)stages, sizeof *plan->stage);
    pipe_costs c = {0};
    plan->cost = opts ? opts->cost : (dm_cost_model){0};
    c.g = g, c.model = &plan->cost, c.microbatches = g->microbatches;
    measure(g, &c);
    /* the schedule does not depend on the cuts: built once, kept for explain and codegen */
    c.in_flight = pipe_xcalloc((size_t)stages, sizeof(int));
    if (pipe_schedule_build_chunked(&plan->schedule, pipe_kind_for(g->schedule, ranks), ranks, chunks, g->microbatches,
                                    1.0, 2.0))
        abort();
    for (int k = 0; k < stages; k++) c.in_flight[k] = pipe_in_flight(&plan->schedule, k);
    int *boundary = pipe_xcalloc((size_t)stages + 1, sizeof(int));
    int errors = 0;
    dm_loc at = g->pipe_axis >= 0 ? g->axes[g->pipe_axis].loc : (dm_loc){0};
    /* a rank holds its chunks' memory: each chunk gets a share of the limit */
    double limit = opts ? opts->memory_limit_bytes / chunks : 0;
    if (stages == 1) {
        boundary[1] = c.n;
    } else if (c.n < stages) {
        if (chunks > 1) {
            dm_error(d, at, "%d pipeline ranks x %d chunks make %d stages, but the forward pass has %d ops", ranks, chunks,
                     stages, c.n);
            dm_note(d, at, "fewer chunks (--chunks), or another schedule");
        } else
            dm_error(d, at, "%d pipeline stages, but the forward pass has %d ops", stages, c.n);
        errors++;
    } else if (g->n_cuts) {
        errors += pipeline_user_cuts(g, c.n, c.op, stages, chunks, boundary, d);
        plan->by_user = 1;
    } else if (pipe_choose_cuts(&c, stages, limit, NULL, boundary)) {
        /* without a limit every cut of n >= stages ops fits: only the limit can refuse */
        dm_error(d, at, "no cut into %d stages fits %.3g GiB per rank (--memory-gb)", stages,
                 opts->memory_limit_bytes / (1 << 30));
        dm_note(d, at, "raise --memory-gb, use more stages, or 1f1b (fewer micro-batches in flight)%s",
                chunks > 1 ? "; each of a rank's chunks gets an equal share of the limit" : "");
        errors++;
    }
    if (!errors && c.n == 0) {
        plan->stage[0].first = plan->stage[0].last = -1;
        place_the_rest(g, plan);
    } else if (!errors) {
        for (int k = 0; k < stages; k++)
            for (int q = boundary[k]; q < boundary[k + 1]; q++) g->values[c.op[q]]->stage = k;
        place_the_rest(g, plan);
        errors += pipeline_tied_order(g, plan, d);
        summarise(g, &c, boundary, plan);
        time_schedule(g, plan, opts ? opts->bucket_bytes : 0);
        if (!errors) pipeline_warn_imbalance(g, plan, at, d);
    }
    free(boundary);
    pipe_costs_free(&c);
    return errors;
}

void pipeline_plan_readers(dm_pipeline_plan *plan, const ir_graph *g, const dm_memory_plan *mem) {
    free(plan->readers);
    plan->readers = pipe_xcalloc((size_t)g->n_values + 1, sizeof(uint64_t));
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        /* a reshape or view in its operand's buffer runs no code: it reads nothing. Other
         * values in another's buffer do run and read their operands: the pads and adds of a
         * window assembly writing into their sum's (a concat's pieces), a bias's or a sum's
         * add, a cross-entropy gradient over its logits */
        if (ir_op_info_of(v->op)->cls == OPC_SOURCE || v->stage >= 64 ||
            (ir_in_operand_buffer(v) && mem->storage_of[i] == mem->storage_of[v->operands[0]]))
            continue;
        for (int k = 0; k < v->n_operands; k++)
            if (ir_reads_operand(v, k)) plan->readers[mem->storage_of[v->operands[k]]] |= (uint64_t)1 << v->stage;
    }
}

void dm_pipeline_plan_free(dm_pipeline_plan *plan) {
    if (plan->schedule.actions) pipe_schedule_free(&plan->schedule);
    if (plan->timed.actions) pipe_schedule_free(&plan->timed);
    free(plan->readers);
    free(plan->stage);
    free(plan->tied);
    free(plan->tied_on);
    memset(plan, 0, sizeof *plan);
}

void dm_plans_renumber(const int *map, dm_pipeline_plan *pipe, dm_reshard_list *reshards) {
    for (int r = 0; reshards && r < reshards->n; r++) reshards->items[r].value = map[reshards->items[r].value];
    for (int s = 0; pipe && pipe->stage && s < pipe->stages; s++) {
        if (pipe->stage[s].first >= 0) pipe->stage[s].first = map[pipe->stage[s].first];
        if (pipe->stage[s].last >= 0) pipe->stage[s].last = map[pipe->stage[s].last];
    }
    for (int t = 0; pipe && t < pipe->n_tied; t++) pipe->tied[t] = map[pipe->tied[t]];
}
