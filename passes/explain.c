/* explain.c: the plan of one rank, for people (text) and tools (JSON). requires: the
 * memory plan. Types are printed in the .dm notation, f32[B@data, H]{+tensor}. */
#include <stdlib.h>
#include <string.h>

#include "explain.h"
#include "schedule.h"

void explain_mib(double elems, char *buf, size_t size) { snprintf(buf, size, "%.2f MiB", elems * 4.0 / (1024.0 * 1024.0)); }

void explain_json_string(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

static void list_values_json(const ir_graph *g, const int *ids, int n, FILE *out) {
    fputc('[', out);
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[ids[i]];
        char type[256];
        ir_format_type(g, &v->type, type, sizeof type);
        fprintf(out, "%s{\"name\": ", i ? ", " : "");
        explain_json_string(out, v->name ? v->name : "");
        fprintf(out, ", \"type\": ");
        explain_json_string(out, type);
        fprintf(out, ", \"elements\": %lld, \"elements_per_rank\": %lld, \"line\": %d}", (long long)ir_numel(&v->type),
                (long long)ir_local_numel(g, &v->type), v->loc.line);
    }
    fputc(']', out);
}

static void list_values(const ir_graph *g, const char *title, const int *ids, int n, FILE *out) {
    if (!n) return;
    fprintf(out, "%s:\n", title);
    for (int i = 0; i < n; i++) {
        const ir_value *v = g->values[ids[i]];
        char type[256];
        ir_format_type(g, &v->type, type, sizeof type);
        fprintf(out, "  %-28s %-32s line %d\n", v->name ? v->name : "?", type, v->loc.line);
    }
}

/* Listed collectives are collective ops, or cross-entropy statistics over split classes. */
static int is_split_cross_entropy(const ir_value *c) { return c->op == OP_XENT_STATS; }

/* The mesh axis a collective communicates over (a split cross-entropy: its classes'). */
int explain_collective_axis(const ir_graph *g, const ir_value *c) {
    return is_split_cross_entropy(c) ? ir_class_split_axis(g, c) : c->mesh_axis;
}

/* "allreduce", "allgather", ...; a split cross-entropy's statistics: "allgather+allreduce" */
const char *explain_collective_kind(const ir_value *c) {
    return is_split_cross_entropy(c) ? "allgather+allreduce" : ir_op_info_of(c->op)->name;
}

/* Calls a collective makes: a split cross-entropy makes an allgather and an allreduce. */
int explain_collective_calls(const ir_value *c) { return is_split_cross_entropy(c) ? 2 : 1; }

/* "allreduce(data)", "allgather(tensor, dim 1)" */
static void collective_str(const ir_graph *g, const ir_value *c, char *buf, size_t size) {
    const char *axis = g->axes[explain_collective_axis(g, c)].name;
    switch (c->op) {
    case OP_XENT_STATS: snprintf(buf, size, "allgather+allreduce(%s)", axis); break;
    case OP_ALLREDUCE:
    case OP_AS_PENDING: snprintf(buf, size, "%s(%s)", ir_op_info_of(c->op)->name, axis); break;
    case OP_ALLTOALL: snprintf(buf, size, "alltoall(%s, dim %d -> %d)", axis, c->axis, c->axis2); break;
    default: snprintf(buf, size, "%s(%s, dim %d)", ir_op_info_of(c->op)->name, axis, c->axis); break;
    }
}

/* Bytes one rank contributes: its shard of the operand (a local slice moves nothing). */
int64_t explain_collective_bytes(const ir_graph *g, const ir_value *c) {
    if (c->op == OP_SHARD_SLICE || c->op == OP_AS_PENDING) return 0;
    if (is_split_cross_entropy(c)) {
        /* per local row: its maximum (gathered), then the sum of exponentials and the
         * target's logit (summed); the gradient reads them and exchanges nothing */
        const ir_type *logits = &g->values[c->operands[0]]->type;
        int64_t rows = ir_local_numel(g, logits) / (logits->shape[logits->rank - 1] / g->axes[explain_collective_axis(g, c)].size);
        return rows * 3 * 4;
    }
    return ir_local_numel(g, &g->values[c->operands[0]]->type) * 4;
}

/* Bytes one rank sends in the collective by ring algorithms (cost_collective_sent); it
 * receives as many. */
double explain_collective_sent_bytes(const ir_graph *g, const ir_value *c) {
    double messages;
    return cost_collective_sent(g, c, &messages);
}

const char *const explain_phase_names[3] = {"forward", "backward", "update"};

int explain_per_step(const ir_graph *g, int phase) {
    return phase == PHASE_UPDATE || g->microbatches < 1 ? 1 : g->microbatches;
}

/* What each rank sends in a step, summed by phase and mesh axis (sent[phase][axis]): the
 * forward's and backward's collectives once per micro-batch; with ZeRO (zero not NULL), its
 * collectives in place of the allreduces they replace. */
static void sent_by_phase_axis(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                               double sent[3][IR_MAX_AXES]) {
    memset(sent, 0, sizeof(double) * 3 * IR_MAX_AXES);
    for (int i = 0; r && i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        if (!explain_replaced(g, zero, r->items[i].value))
            sent[c->phase][explain_collective_axis(g, c)] +=
                explain_per_step(g, c->phase) * explain_collective_sent_bytes(g, c);
    }
    explain_zero_collective *zc;
    int n = explain_zero_collectives(g, zero, &zc);
    for (int i = 0; i < n; i++) sent[zc[i].phase][zc[i].axis] += explain_per_step(g, zc[i].phase) * zc[i].sent;
    free(zc);
}

int explain_pipeline_ranks(const dm_pipeline_plan *pl) {
    return pl && pl->stages > 1 && pl->ranks > 1 ? pl->ranks : 1;
}

void explain_sent_by_pipeline_rank(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                                   const dm_pipeline_plan *pl, double *by_rank) {
    int P = explain_pipeline_ranks(pl);
    for (int k = 0; k < P; k++) by_rank[k] = 0;
    for (int i = 0; r && i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        if (explain_replaced(g, zero, r->items[i].value)) continue;
        by_rank[c->stage > 0 ? c->stage % P : 0] += explain_per_step(g, c->phase) * explain_collective_sent_bytes(g, c);
    }
    explain_zero_collective *zc;
    int n = explain_zero_collectives(g, zero, &zc);
    for (int i = 0; i < n; i++) {
        int stage = zero->bucket[zc[i].bucket].stage;
        by_rank[stage > 0 ? stage % P : 0] += explain_per_step(g, zc[i].phase) * zc[i].sent;
    }
    free(zc);
}

/* The headline's "each rank sends": one figure, or (a pipeline) one per pipeline rank,
 * which sends only its stages' collectives. */
void explain_sent_headline(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero, const dm_pipeline_plan *pl,
                           double total, void (*bytes_str)(double bytes, char *buf, size_t size), FILE *out) {
    char s[32];
    int P = explain_pipeline_ranks(pl);
    if (P == 1) {
        bytes_str(total, s, sizeof s);
        fprintf(out, "by ring algorithms each rank sends %s (and receives as much)", s);
        return;
    }
    double *by_rank = calloc((size_t)P, sizeof(double));
    if (!by_rank) abort();
    explain_sent_by_pipeline_rank(g, r, zero, pl, by_rank);
    fprintf(out, "by ring algorithms a rank sends its own stages' (and receives as much): on pipeline rank");
    for (int k = 0; k < P; k++) {
        bytes_str(by_rank[k], s, sizeof s);
        fprintf(out, "%s %d %s", k ? "," : "", k, s);
    }
    free(by_rank);
}

static void mib_of_bytes(double bytes, char *buf, size_t size) { explain_mib(bytes / 4.0, buf, size); }

/* --explain=full: the reshard list as the passes placed it; a row that ZeRO's buckets or
 * the parameter servers replace says so (their sections say with what). */
static void list_collectives(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero,
                             const dm_pipeline_plan *pl, FILE *out) {
    if (!r || r->n == 0) {
        fprintf(out, "\ncollectives: none (every value is whole on every rank)\n\n");
        return;
    }
    int64_t total = 0;
    double total_sent = 0;
    int calls = 0, by_servers = 0;
    for (int i = 0; i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        /* the sums are the step's traffic, as the phases' below: the parameter servers'
         * exchange (their section) runs in place of these */
        if (explain_replaced_by_param_servers(g, r->items[i].value)) {
            by_servers++;
            continue;
        }
        int times = explain_per_step(g, c->phase);
        total += times * explain_collective_bytes(g, c);
        total_sent += times * explain_collective_sent_bytes(g, c);
        calls += times * explain_collective_calls(c);
    }
    char t[32], s[32];
    explain_mib((double)total / 4.0, t, sizeof t);
    if (explain_pipeline_ranks(pl) > 1) {
        fprintf(out, "\ncollectives: %d per step on %s of operands over the pipeline's stages; ", calls, t);
        explain_sent_headline(g, r, NULL, pl, total_sent, mib_of_bytes, out);
        fprintf(out, "\n  in all:");
    } else {
        explain_mib(total_sent / 4.0, s, sizeof s);
        fprintf(out, "\ncollectives: %d per step on %s of operands per rank; by ring algorithms each rank sends %s (and\n"
                     "receives as much):", calls, t, s);
    }
    double sent[3][IR_MAX_AXES];
    sent_by_phase_axis(g, r, NULL, sent); /* the list's own collectives, as its rows */
    for (int p = 0, n = 0; p < 3; p++)
        for (int a = 0; a < g->n_axes; a++) {
            if (sent[p][a] <= 0) continue;
            explain_mib(sent[p][a] / 4.0, s, sizeof s);
            fprintf(out, "%s %s over %s %s", n++ ? "," : "", explain_phase_names[p], g->axes[a].name, s);
        }
    if (by_servers)
        fprintf(out, "; not counted: the %d listed below that the parameter servers replace", by_servers);
    if (g->microbatches > 1)
        fprintf(out, "; the forward's and backward's each of the %d micro-batches (the rows below: one call)",
                g->microbatches);
    fprintf(out, "\n  %-8s %-28s %-30s %-28s %12s %12s\n", "phase", "collective", "value", "type", "operand", "sent");
    for (int i = 0; i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        const ir_value *src = g->values[c->operands[0]];
        char op[96], type[256], bytes[32];
        collective_str(g, c, op, sizeof op);
        ir_format_type(g, &src->type, type, sizeof type);
        explain_mib((double)explain_collective_bytes(g, c) / 4.0, bytes, sizeof bytes);
        explain_mib(explain_collective_sent_bytes(g, c) / 4.0, s, sizeof s);
        const char *replaced = explain_replaced_by_zero(g, zero, r->items[i].value) ? " [replaced by its ZeRO bucket]"
                             : explain_replaced_by_param_servers(g, r->items[i].value) ? " [replaced by the parameter servers]"
                                                                                        : "";
        fprintf(out, "  %-8s %-28s %-30s %-28s %12s %12s  line %-4d %s%s\n", explain_phase_names[c->phase], op,
                src->name ? src->name : ir_op_info_of(src->op)->name, type, bytes, s, r->items[i].source_line,
                r->items[i].reason, replaced);
    }
    fprintf(out, "\n");
}

static void list_collectives_json(const ir_graph *g, const dm_reshard_list *r, const dm_zero_plan *zero, FILE *out) {
    /* (each names its pipeline stage: a rank sends only its stages') */
    fprintf(out, "[");
    for (int i = 0; r && i < r->n; i++) {
        const ir_value *c = g->values[r->items[i].value];
        const ir_value *src = g->values[c->operands[0]];
        char type[256];
        ir_format_type(g, &src->type, type, sizeof type);
        fprintf(out, "%s{\"op\": ", i ? ", " : "");
        explain_json_string(out, explain_collective_kind(c));
        fprintf(out, ", \"axis\": ");
        explain_json_string(out, g->axes[explain_collective_axis(g, c)].name);
        if (c->op != OP_ALLREDUCE && !is_split_cross_entropy(c)) fprintf(out, ", \"dim\": %d", c->axis);
        if (c->op == OP_ALLTOALL) fprintf(out, ", \"to_dim\": %d", c->axis2);
        fprintf(out, ", \"phase\": \"%s\", \"stage\": %d, \"value\": ", explain_phase_names[c->phase], c->stage > 0 ? c->stage : 0);
        explain_json_string(out, src->name ? src->name : ir_op_info_of(src->op)->name);
        fprintf(out, ", \"type\": ");
        explain_json_string(out, type);
        fprintf(out, ", \"bytes_per_rank\": %lld, \"sent_bytes_per_rank\": %.0f, \"line\": %d, \"reason\": ",
                (long long)explain_collective_bytes(g, c), explain_collective_sent_bytes(g, c), r->items[i].source_line);
        explain_json_string(out, r->items[i].reason);
        if (explain_replaced_by_zero(g, zero, r->items[i].value)) fprintf(out, ", \"replaced_by_zero\": true");
        if (explain_replaced_by_param_servers(g, r->items[i].value)) fprintf(out, ", \"replaced_by_param_servers\": true");
        fprintf(out, "}");
    }
    fprintf(out, "]");
}

/* "communication": each rank's sent bytes by ring algorithms, in all and by phase and axis
 * (a pipeline's: every stage's collectives, and by pipeline coordinate what its ranks send) */
static void sent_json(const ir_graph *g, const dm_memory_plan *mem, const dm_reshard_list *r, const dm_zero_plan *zero,
                      const dm_pipeline_plan *pl, FILE *out) {
    double sent[3][IR_MAX_AXES], total = 0;
    sent_by_phase_axis(g, r, zero, sent);
    fprintf(out, ", \"communication\": {\"algorithm\": \"ring\", \"by_phase_axis\": [");
    for (int p = 0, n = 0; p < 3; p++)
        for (int a = 0; a < g->n_axes; a++) {
            if (sent[p][a] <= 0) continue;
            total += sent[p][a];
            fprintf(out, "%s{\"phase\": \"%s\", \"axis\": ", n++ ? ", " : "", explain_phase_names[p]);
            explain_json_string(out, g->axes[a].name);
            fprintf(out, ", \"sent_bytes_per_rank\": %.0f}", sent[p][a]);
        }
    fprintf(out, "], \"sent_bytes_per_rank\": %.0f, \"received_bytes_per_rank\": %.0f, \"microbatches\": %d", total,
            total, explain_per_step(g, PHASE_FORWARD));
    int P = explain_pipeline_ranks(pl);
    if (P > 1) {
        double *by_rank = calloc((size_t)P, sizeof(double));
        if (!by_rank) abort();
        explain_sent_by_pipeline_rank(g, r, zero, pl, by_rank);
        fprintf(out, ", \"sent_bytes_by_pipeline_rank\": [");
        for (int k = 0; k < P; k++) fprintf(out, "%s%.0f", k ? ", " : "", by_rank[k]);
        fprintf(out, "]");
        free(by_rank);
        explain_p2p_json(g, mem, pl, out);
    }
    fprintf(out, "}");
}

/* "h1 (line 43)" */
static void value_str(const ir_value *v, char *buf, size_t size) {
    if (v->name) snprintf(buf, size, "%s (line %d)", v->name, v->loc.line);
    else snprintf(buf, size, "line %d", v->loc.line);
}

static int pipelined(const ir_graph *g, const dm_pipeline_plan *pl) {
    return pl && (pl->stages > 1 || g->microbatches > 1) && pl->stage[0].first >= 0;
}

static void pipeline_json(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    fprintf(out, ", \"pipeline\": {\"stages\": %d, \"ranks\": %d, \"chunks\": %d, \"microbatches\": %d, \"schedule\": \"%s\", "
                 "\"cuts_by\": \"%s\", \"bubble_formula\": %.6f, \"bubble_simulated\": %.10g, \"step_seconds_simulated\": %.10g, "
                 "\"imbalance\": %.4f, ",
            pl->stages, pl->ranks, pl->chunks, g->microbatches, pipe_kind_name(pipe_kind_for(g->schedule, pl->ranks)),
            pl->by_user ? "program" : "dmc",
            pipe_flushless(pl->timed.kind) ? pipe_bubble_formula_2bw(pl->ranks, g->microbatches)
                                           : pipe_bubble_formula_chunked(pl->ranks, pl->chunks, g->microbatches),
            pl->bubble,
            pl->timed.step, pl->imbalance);
    if (pipe_flushless(pl->timed.kind)) fprintf(out, "\"warmup_seconds_once\": %.10g, ", pipe_2bw_warmup(&pl->timed));
    fprintf(out, "\"stage\": [");
    for (int k = 0; k < pl->stages; k++) {
        const dm_stage_plan *s = &pl->stage[k];
        fprintf(out, "%s{\"first\": ", k ? ", " : "");
        explain_json_string(out, g->values[s->first]->name ? g->values[s->first]->name : "");
        fprintf(out, ", \"last\": ");
        explain_json_string(out, g->values[s->last]->name ? g->values[s->last]->name : "");
        fprintf(out, ", \"rank\": %d, \"chunk\": %d", dm_rank_of_stage(pl, k), k / pl->ranks);
        fprintf(out, ", \"first_line\": %d, \"last_line\": %d, \"seconds\": %.6g, \"forward_seconds\": %.6g, "
                     "\"backward_seconds\": %.6g, \"flops\": %.6g, "
                     "\"recv_bytes\": %lld, \"activation_bytes\": %lld, \"in_flight\": %d, \"param_bytes\": %lld}",
                g->values[s->first]->loc.line, g->values[s->last]->loc.line, s->seconds, s->forward_seconds,
                s->backward_seconds, s->flops,
                (long long)s->recv_elems * 4, (long long)s->activation_elems * 4, s->in_flight, (long long)s->param_elems * 4);
    }
    fprintf(out, "], \"tied\": [");
    for (int t = 0; t < pl->n_tied; t++) {
        const ir_value *v = g->values[pl->tied[t]];
        fprintf(out, "%s{\"name\": ", t ? ", " : "");
        explain_json_string(out, v->name);
        fprintf(out, ", \"updated_on\": %d, \"stages\": [", v->stage);
        for (int k = 0, n = 0; k < pl->stages && k < 64; k++)
            if (pl->tied_on[t] >> k & 1) fprintf(out, "%s%d", n++ ? ", " : "", k);
        fprintf(out, "]}");
    }
    fprintf(out, "]}");
}

/* Interleaved: the stages each pipeline rank holds, its chunks a, b, ... */
static void chunks_text(const dm_pipeline_plan *pl, FILE *out) {
    int P = pl->ranks;
    fprintf(out, "  chunks: stage j runs on pipeline rank j mod %d as its chunk j / %d:", P, P);
    for (int r = 0; r < P; r++) {
        fprintf(out, "%s rank %d holds stages", r ? ";" : "", r);
        for (int c = 0; c < pl->chunks; c++) fprintf(out, "%s %d (%c)", c ? "," : "", c * P + r, 'a' + c);
    }
    fprintf(out, "\n");
}

/* One line per stage: its ops, predicted time and share, what it receives, its activations. */
static void stages_text(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    double total = 0;
    int chunked = pl->chunks > 1;
    for (int k = 0; k < pl->stages; k++) total += pl->stage[k].seconds;
    fprintf(out, "  %-5s %s%-52s %10s %6s %12s %22s\n", "stage", chunked ? "rank " : "", "forward ops", "time/micro", "share",
            "recv/micro", "activations in flight");
    for (int k = 0; k < pl->stages; k++) {
        const dm_stage_plan *s = &pl->stage[k];
        char first[96], last[96], ops[200], recv[32], act[32], all[32], flight[96], rank[16] = "";
        value_str(g->values[s->first], first, sizeof first);
        value_str(g->values[s->last], last, sizeof last);
        snprintf(ops, sizeof ops, "%s .. %s", first, last);
        if (k) explain_mib((double)s->recv_elems, recv, sizeof recv);
        else snprintf(recv, sizeof recv, "-");
        explain_mib((double)(s->activation_elems + s->recv_elems), act, sizeof act);
        explain_mib((double)(s->activation_elems + s->recv_elems) * s->in_flight, all, sizeof all);
        snprintf(flight, sizeof flight, "%d x %s = %s", s->in_flight, act, all);
        if (chunked) snprintf(rank, sizeof rank, "%d%c   ", dm_rank_of_stage(pl, k), 'a' + k / pl->ranks);
        fprintf(out, "  %-5d %s%-52s %8.3f ms %5.1f%% %12s   %s\n", k, rank, ops, s->seconds * 1e3,
                total > 0 ? 100 * s->seconds / total : 0, recv, flight);
    }
}

/* The simulated bubble beside the formula for equal stages. */
static void bubble_text(const ir_graph *g, const dm_pipeline_plan *pl, FILE *out) {
    int P = pl->ranks, M = g->microbatches, v = pl->chunks;
    if (pipe_flushless(pl->timed.kind)) {
        fprintf(out, "bubble: %.1f%% of stage-time idle in a steady step, simulating %d steps' stream with each stage's\n"
                     "  predicted forward and backward times (a step of %.3f ms). No flush: no step waits for its batch's\n"
                     "  last backwards; but a step ends in collectives over every rank (its loss, the host's agreement to\n"
                     "  go on), and then the last stage waits for the first forward: equal stages (backward 2x forward)\n"
                     "  would give (P - 1) / (3 M + P - 1) = %d / %d = %.1f%%, 1f1b (P - 1) / (M + P - 1) = %.1f%%;\n"
                     "  once a run, the drain after the last step takes %.3f ms more\n",
                100 * pl->bubble, pl->timed.batches, pl->timed.step * 1e3, P - 1, 3 * M + P - 1,
                100 * pipe_bubble_formula_2bw(P, M), 100 * pipe_bubble_formula(P, M), pipe_2bw_warmup(&pl->timed) * 1e3);
        return;
    }
    fprintf(out, "bubble: %.1f%% of %s-time idle, simulating the schedule with each stage's predicted forward and\n"
                 "  backward times (a step of %.3f ms); ", 100 * pl->bubble, v > 1 ? "rank" : "stage", pl->timed.step * 1e3);
    if (v == 1) {
        fprintf(out, "equal stages would give (P - 1) / (M + P - 1) = %d / %d = %.1f%%\n", P - 1, M + P - 1,
                100 * pipe_bubble_formula(P, M));
        return;
    }
    fprintf(out, "equal stages would give (P - 1) / (v M + P - 1) = %d / %d = %.1f%%:\n"
                 "  (1/v)(P - 1)/M = %.1f%% of the ideal step, 1/%d of 1F1B's on %d stages (%.1f%% idle)\n",
            P - 1, v * M + P - 1, 100 * pipe_bubble_formula_chunked(P, v, M), 100.0 * (P - 1) / ((double)v * M), v, P,
            100 * pipe_bubble_formula(P, M));
}

/* draw_grid: the schedule, one column per forward time (as wide as 3 (M + P - 1) + 2 M
 * columns, so only in --explain=full) */
static void pipeline_text(const ir_graph *g, const dm_memory_plan *mem, const dm_pipeline_plan *pl, int draw_grid,
                          FILE *out) {
    int P = pl->stages, M = g->microbatches;
    if (P == 1) {
        fprintf(out, "micro-batches: %d of %s = %lld each, their gradients summed (accumulation): the step's batch\n"
                     "  is %s = %lld, in the memory of one micro-batch\n\n",
                M, g->batch_dim, (long long)(g->batch_whole / M), g->batch_dim, (long long)g->batch_whole);
        return;
    }
    pipe_kind kind = pipe_kind_for(g->schedule, pl->ranks);
    fprintf(out, "pipeline: %d stages", P);
    if (pl->chunks > 1) fprintf(out, " (%d ranks x %d chunks)", pl->ranks, pl->chunks);
    fprintf(out, " x %d micro-batch%s", M, M == 1 ? "" : "es");
    if (M > 1) fprintf(out, " (%s = %lld as %d of %lld)", g->batch_dim, (long long)g->batch_whole, M, (long long)(g->batch_whole / M));
    fprintf(out, ", schedule %s\n", pipe_kind_name(kind));
    if (pl->chunks > 1) chunks_text(pl, out);
    fprintf(out, "  cuts %s\n", pl->by_user ? "as the program gives them (schedule ... cuts = [...])"
                                            : "chosen by dmc: the slowest stage as fast as it can be (dynamic programming)");
    stages_text(g, pl, out);
    fprintf(out, "  imbalance: the slowest stage takes %.2fx the mean (time predicted by cost rules, not measured)\n",
            pl->imbalance);
    for (int t = 0; t < pl->n_tied; t++) {
        const ir_value *v = g->values[pl->tied[t]];
        fprintf(out, "  tied: '%s' is used on stages", v->name);
        for (int k = 0, n = 0; k < P && k < 64; k++)
            if (pl->tied_on[t] >> k & 1) fprintf(out, "%s %d", n++ ? "," : "", k);
        fprintf(out, ": each holds it, stage %d sums its gradient and updates it, then sends it to the others\n",
                v->stage);
    }
    explain_p2p_text(g, mem, pl, draw_grid, out);
    if (draw_grid && pl->chunks > 1) {
        fprintf(out, "\nschedule %s, one column per forward time of a stage (a backward takes two), Fmc/Bmc:\n"
                     "forward/backward of micro-batch m on the rank's chunk c (a, b, ...), '.': idle\n", pipe_kind_name(kind));
        pipe_schedule_print(&pl->schedule, out);
    } else if (draw_grid && pipe_flushless(kind)) {
        fprintf(out, "\nschedule %s, %d steps' stream, one column per forward time (a backward takes two), Fi/Bi:\n"
                     "forward/backward of micro-batch i of the stream (step i / %d's micro-batch i %% %d), '.': idle; step t\n"
                     "runs F(t M .. t M + M - 1) and the backwards between, the previous step's last ones first\n",
                pipe_kind_name(kind), pl->schedule.batches, M, M);
        pipe_schedule_print(&pl->schedule, out);
    } else if (draw_grid) {
        fprintf(out, "\nschedule %s, one column per forward time (a backward takes two), Fm/Bm: forward/backward of\n"
                     "micro-batch m, '.': idle\n", pipe_kind_name(kind));
        pipe_schedule_print(&pl->schedule, out);
    }
    bubble_text(g, pl, out);
    fprintf(out, "\n");
}

/* ZeRO 3's gathers of parameters (passes/zero_gather.c) in one micro-batch: their count
 * and the elements they gather. */
static int zero_gathers(const ir_graph *g, int64_t *elements) {
    int n = 0;
    *elements = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->op == OP_ZERO_GATHER) n++, *elements += ir_numel(&g->values[i]->type);
    return n;
}

/* ZeRO's buckets: which gradients each reduce-scatters and how much of it a rank updates
 * (full: a line per bucket; otherwise their count and sums, which read at any size). */
static void zero_text(const ir_graph *g, const dm_zero_plan *z, int full, FILE *out) {
    const dm_zero_bucket *b0 = &z->bucket[0];
    int64_t gathered;
    int gathers = zero_gathers(g, &gathered);
    fprintf(out, "ZeRO %d over %s (%lld ranks): the optimizer state%s of each gradient bucket split into\n"
                 "equal shares of its flat range; instead of the bucket's allreduce, a reduce-scatter of its\n"
                 "gradients, the update of this rank's share, and %s\n",
            z->stage, g->axes[b0->axis].name, (long long)g->axes[b0->axis].size,
            z->stage >= 3 ? ", gradients and parameters" : z->stage >= 2 ? " and gradients" : "",
            gathers ? "no all-gather of the parameters: they stay in shares" : "an all-gather of its parameters (the same bytes)");
    if (gathers) {
        char elems[32];
        explain_mib((double)gathered, elems, sizeof elems);
        fprintf(out, "and each bucket the passes read is all-gathered before its first reader in the forward pass\n"
                     "and again in the backward (the next one started ahead), freed after its last reader:\n"
                     "%d all-gathers of %s per micro-batch%s\n", gathers, elems, full ? " (shares marked * below)" : "");
        /* a bucket holding a parameter read on two pipeline stages (a tied embedding) keeps its
         * parameters whole (passes/zero_gather.c): its update all-gathers them */
        int whole = 0;
        for (int k = 0; k < z->n_buckets; k++) whole += z->bucket[k].param_at < 0;
        if (whole)
            fprintf(out, "except %d bucket%s whose parameters stay whole (one read on two pipeline stages, as a tied\n"
                         "embedding, is in it): its update all-gathers them\n", whole, whole == 1 ? "" : "s");
    }
    if (!full) {
        int64_t elements = 0, largest = 0, shares = 0;
        for (int k = 0; k < z->n_buckets; k++) {
            elements += z->bucket[k].span;
            shares += z->bucket[k].share;
            if (z->bucket[k].span > largest) largest = z->bucket[k].span;
        }
        fprintf(out, "  %d bucket%s of %lld elements (the largest %lld), a rank's shares %lld (--explain=full lists "
                     "them)\n\n", z->n_buckets, z->n_buckets == 1 ? "" : "s", (long long)elements, (long long)largest,
                (long long)shares);
        return;
    }
    fprintf(out, "  %-6s %-5s %-52s %12s %12s\n", "bucket", "stage", "parameters", "elements", "share/rank");
    for (int k = 0; k < z->n_buckets; k++) {
        const dm_zero_bucket *b = &z->bucket[k];
        char params[200];
        int n = b->last - b->first + 1;
        if (n == 1) snprintf(params, sizeof params, "%s", g->values[g->params[b->first]]->name);
        else snprintf(params, sizeof params, "%s .. %s (%d)", g->values[g->params[b->first]]->name,
                      g->values[g->params[b->last]]->name, n);
        fprintf(out, "  %-6d %-5d %-52s %12lld %12lld%s\n", k, b->stage, params, (long long)b->span, (long long)b->share,
                b->param_at >= 0 ? " *" : "");
    }
    fprintf(out, "\n");
}

/* The forward ops made again in the backward pass (passes/recompute.c), and their flops. */
static int recomputed_ops(const ir_graph *g, double *flops) {
    int n = 0;
    double f = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_BACKWARD || v->segment <= 0) continue;
        n++;
        f += cost_of_op(g, v).flops;
    }
    if (flops) *flops = f;
    return n;
}

static void recompute_text(const ir_graph *g, FILE *out) {
    static const char *const modes[] = {"the calls in recompute(...)", "full", "selective", "off"};
    double flops, total = 0;
    int n = recomputed_ops(g, &flops);
    if (!n) return;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->phase != PHASE_UPDATE) total += cost_of_op(g, g->values[i]).flops;
    fprintf(out, "recomputation (%s): %d forward ops made again in the backward pass, %.3g GFLOP per rank and\n"
                 "micro-batch (%.1f%% of the step's); %s\n\n",
            modes[g->recompute], n, flops / 1e9, total > 0 ? 100 * flops / total : 0.0,
            g->recompute == RECOMPUTE_SELECTIVE ? "products and gathers keep their outputs, the rest is made again"
                                                : "each such layer call keeps only its inputs for the backward");
}

/* The attentions fused into one kernel (passes/fuse_attention.c), the forward's: their
 * count, the first one's line, and per rank and micro-batch the elements of row
 * log-sum-exp they keep for the backward and of probabilities the unfused ops would. */
typedef struct fused_attention {
    int count, line;
    double kept_elems, probability_elems;
    int grouped, group;            /* grouped-query attentions (kv_group > 1), and the last's R */
    double repeat_elems;           /* the copies of k and v repeat_kv would have made for them */
} fused_attention;

static fused_attention fused_attentions(const ir_graph *g) {
    fused_attention f = {0};
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ATTENTION || v->phase != PHASE_FORWARD) continue;
        double rows = (double)ir_local_numel(g, &v->type) / (double)v->type.shape[v->type.rank - 1];
        if (!f.count++) f.line = v->loc.line;
        f.kept_elems += rows;
        f.probability_elems += rows * (double)ir_attention_layout_of(v, &v->type).positions;
        if (v->kv_group > 1) {
            f.grouped++;
            f.group = v->kv_group;
            f.repeat_elems += 2.0 * (double)ir_local_numel(g, &v->type);
        }
    }
    return f;
}

/* One line; full: and how (the compact screen of GPT-2 2 x 2 x 2 stays under 60 lines). */
static void attention_text(const ir_graph *g, int full, FILE *out) {
    fused_attention f = fused_attentions(g);
    if (!f.count) return;
    char kept[32], probabilities[32], repeats[32];
    explain_mib(f.kept_elems, kept, sizeof kept);
    explain_mib(f.probability_elems, probabilities, sizeof probabilities);
    fprintf(out, "attention: %d fused (line %d): %s of row statistics kept for the backward instead of %s of probabilities\n",
            f.count, f.line, kept, probabilities);
    if (f.grouped) {
        explain_mib(f.repeat_elems, repeats, sizeof repeats);
        fprintf(out, "  %d grouped-query: k and v read at 1/%d of q's heads, their %s of repeats not made\n", f.grouped,
                f.group, repeats);
    }
    if (g->attention_16bit)
        fprintf(out, "  each multiplies in %s (q, k, v, the probabilities and the gradients rounded in its scratch; "
                     "f32 softmax statistics and results)\n",
                ir_dtype_name(g->product_dtype));
    if (full)
        fprintf(out, "  (one rank's shards, every stage, one micro-batch): blocks of queries and keys with an online softmax,\n"
                     "  the backward makes the scores again; --no-fuse-attention keeps the unfused ops\n");
    fprintf(out, "\n");
}

static void attention_json(const ir_graph *g, FILE *out) {
    fused_attention f = fused_attentions(g);
    fprintf(out,
            ", \"fused_attention\": {\"count\": %d, \"kept_bytes\": %.0f, \"unfused_probability_bytes\": %.0f, "
            "\"grouped\": %d, \"unrepeated_bytes\": %.0f}",
            f.count, 4 * f.kept_elems, 4 * f.probability_elems, f.grouped, 4 * f.repeat_elems);
}

int explain_replaced_by_zero(const ir_graph *g, const dm_zero_plan *zero, int value) {
    for (int p = 0; zero && zero->n_buckets && g->grads && p < g->n_params; p++)
        if (g->grads[p] == value) return zero->bucket_of[p] >= 0;
    return 0;
}

int explain_replaced_by_param_servers(const ir_graph *g, int value) {
    const ir_value *v = g->values[value];
    return g->param_servers.servers && v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE && v->param_index >= 0 &&
           g->grads && g->grads[v->param_index] == value;
}

int explain_replaced(const ir_graph *g, const dm_zero_plan *zero, int value) {
    return explain_replaced_by_zero(g, zero, value) || explain_replaced_by_param_servers(g, value);
}

static void add_zero_collective(const ir_graph *g, explain_zero_collective **out, int *n, int phase, int bucket,
                                const dm_zero_bucket *b, const char *kind, const char *what, int64_t span) {
    int64_t k = g->axes[b->axis].size;
    /* the gradients' reduce-scatter in 16 bits under --compress bf16|fp16 */
    int width = strcmp(kind, "reduce_scatter") == 0 && dm_zero_reduces_half(g, b->axis) ? 2 : 4;
    *out = ir_grow(*out, *n, sizeof **out);
    (*out)[(*n)++] = (explain_zero_collective){
        .phase = phase, .axis = b->axis, .kind = kind, .what = what, .bucket = bucket,
        .bytes = width * (strcmp(kind, "allgather") == 0 ? span / k : span),
        .sent = width * (double)span * (double)(k - 1) / (double)k};
}

int explain_zero_collectives(const ir_graph *g, const dm_zero_plan *zero, explain_zero_collective **out) {
    int n = 0;
    *out = NULL;
    if (!zero || zero->n_buckets == 0) return 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op != OP_ZERO_GATHER) continue;
        int k = zero->bucket_of[g->values[v->operands[0]]->param_index];
        add_zero_collective(g, out, &n, (int)v->phase, k, &zero->bucket[k], "allgather", "ZeRO 3 gathers",
                            ir_numel(&v->type));
    }
    for (int k = 0; k < zero->n_buckets; k++)
        add_zero_collective(g, out, &n, 2, k, &zero->bucket[k], "reduce_scatter", "ZeRO buckets' gradients",
                            zero->bucket[k].span);
    for (int k = 0; k < zero->n_buckets; k++)
        if (zero->bucket[k].param_at < 0)
            add_zero_collective(g, out, &n, 2, k, &zero->bucket[k], "allgather", "ZeRO buckets' parameters",
                                zero->bucket[k].span);
    return n;
}

static void zero_json(const ir_graph *g, const dm_zero_plan *z, FILE *out) {
    fprintf(out, ", \"zero\": {\"stage\": %d, \"buckets\": [", z->stage);
    for (int k = 0; k < z->n_buckets; k++) {
        const dm_zero_bucket *b = &z->bucket[k];
        fprintf(out, "%s{\"axis\": ", k ? ", " : "");
        explain_json_string(out, g->axes[b->axis].name);
        fprintf(out, ", \"stage\": %d, \"first\": ", b->stage);
        explain_json_string(out, g->values[g->params[b->first]]->name);
        fprintf(out, ", \"last\": ");
        explain_json_string(out, g->values[g->params[b->last]]->name);
        fprintf(out, ", \"elements\": %lld, \"share\": %lld, \"parameters_in_shares\": %s}", (long long)b->span,
                (long long)b->share, b->param_at >= 0 ? "true" : "false");
    }
    int64_t gathered;
    int gathers = zero_gathers(g, &gathered);
    fprintf(out, "], \"gathers\": %d, \"gathered_elements\": %lld, \"collectives\": [", gathers, (long long)gathered);
    explain_zero_collective *zc;
    int n = explain_zero_collectives(g, z, &zc);
    for (int i = 0; i < n; i++) {
        fprintf(out, "%s{\"op\": \"%s\", \"axis\": ", i ? ", " : "", zc[i].kind);
        explain_json_string(out, g->axes[zc[i].axis].name);
        fprintf(out, ", \"phase\": \"%s\", \"bucket\": %d, \"stage\": %d, \"bytes_per_rank\": %lld, \"sent_bytes_per_rank\": %.0f}",
                explain_phase_names[zc[i].phase], zc[i].bucket, z->bucket[zc[i].bucket].stage, (long long)zc[i].bytes,
                zc[i].sent);
    }
    free(zc);
    fprintf(out, "]}");
}

/* "memory_bytes_per_rank" to the end of the JSON object */
static void memory_json(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out) {
    fprintf(out, ", \"memory_bytes_per_rank\": {\"params\": %lld, \"grads\": %lld, \"optimizer_state\": %lld, "
                 "\"activations\": %lld, \"activations_without_reuse\": %lld",
            (long long)plan->param_elems * 4, (long long)plan->grad_elems * 4, (long long)plan->state_elems * 4,
            (long long)plan->arena_elems * 4, (long long)plan->arena_unshared_elems * 4);
    /* what a rank allocates at its peak (the C target's layout): the largest rank's, and
     * each stage's (by pipeline coordinate: interleaved, a rank holds several stages) */
    int n_peaks = plan->stages > 1 ? plan->ranks : 1;
    dm_memory_peak *peaks = calloc((size_t)n_peaks, sizeof *peaks);
    if (!peaks) abort();
    int64_t peak = 0;
    for (int k = 0; k < n_peaks; k++) {
        dm_memory_peak_of(plan, g, pipeline, plan->scratch_elems, k, &peaks[k]);
        if (peaks[k].total > peak) peak = peaks[k].total;
    }
    fprintf(out, ", \"peak_bytes_per_rank\": %lld, \"peak_bytes_by_stage\": [", (long long)peak);
    for (int k = 0; k < n_peaks; k++) {
        const dm_memory_peak *pk = &peaks[k];
        fprintf(out, "%s{\"total\": %lld, \"params\": %lld, \"grads\": %lld, \"optimizer_state\": %lld, "
                     "\"activations_in_flight\": %lld, \"gradient_sums\": %lld, \"scratch\": %lld, \"outputs\": %lld, "
                     "\"gathered_outputs_on_request\": %lld",
                k ? ", " : "", (long long)pk->total, (long long)pk->params, (long long)pk->grads,
                (long long)pk->optimizer_state, (long long)pk->activations, (long long)pk->gradient_sums,
                (long long)pk->scratch, (long long)pk->outputs, (long long)pk->gathered_outputs);
        /* under 2bw and pipedream on every stage, so that the parts always sum to total
         * (pipedream's last stage has no stashed version but may keep previous inputs) */
        if (dm_runs_2bw(g))
            fprintf(out, ", \"weight_version\": %lld, \"previous_inputs\": %lld", (long long)pk->weight_version,
                    (long long)pk->previous_inputs);
        fprintf(out, "}");
    }
    free(peaks);
    fprintf(out, "]");
    /* pipelines: each stage's ranks' own (the figures above are the largest of them) */
    fprintf(out, ", \"stages\": [");
    for (int k = 0; k < plan->stages && plan->stages > 1; k++) {
        const dm_stage_memory *m = &plan->stage[k];
        fprintf(out, "%s{\"rank\": %d, \"params\": %lld, \"grads\": %lld, \"optimizer_state\": %lld, \"activations\": %lld, "
                     "\"activations_kept\": %lld, \"in_flight\": %d, \"activations_held\": %lld}",
                k ? ", " : "", dm_rank_of_stage(pipeline, k), (long long)m->param_elems * 4, (long long)m->grad_elems * 4,
                (long long)m->state_elems * 4, (long long)m->arena_elems * 4, (long long)m->kept_elems * 4, m->in_flight,
                (long long)m->held_elems * 4);
    }
    fprintf(out, "]}}\n");
}

static void explain_json(const ir_graph *g, const dm_memory_plan *plan, const dm_reshard_list *reshards,
                         const dm_pipeline_plan *pipeline, const dm_zero_plan *zero, const char *source_path, FILE *out) {
    int64_t ranks = ir_mesh_ranks(g);
    fprintf(out, "{\"model\": ");
    explain_json_string(out, g->model);
    fprintf(out, ", \"source\": ");
    explain_json_string(out, source_path);
    fprintf(out, ", \"mesh\": [");
    for (int a = 0; a < g->n_axes; a++) {
        fprintf(out, "%s{\"axis\": ", a ? ", " : "");
        explain_json_string(out, g->axes[a].name);
        fprintf(out, ", \"size\": %lld}", (long long)g->axes[a].size);
    }
    fprintf(out, "], \"ranks\": %lld, \"inputs\": ", (long long)ranks);
    list_values_json(g, g->inputs, g->n_inputs, out);
    fprintf(out, ", \"params\": ");
    list_values_json(g, g->params, g->n_params, out);
    fprintf(out, ", \"outputs\": ");
    list_values_json(g, g->outputs, g->n_outputs, out);
    fprintf(out, ", \"collectives\": ");
    list_collectives_json(g, reshards, zero, out);
    sent_json(g, plan, reshards, zero, pipeline, out);
    explain_compress_json(g, out);
    explain_ps_json(g, out);
    explain_prune_json(g, out);
    explain_quant_json(g, plan, pipeline, out);
    if (pipelined(g, pipeline)) pipeline_json(g, pipeline, out);
    explain_time_json(g, pipeline, out);
    if (zero && zero->n_buckets > 0) zero_json(g, zero, out);
    fprintf(out, ", \"recomputed_ops\": %d", recomputed_ops(g, NULL));
    attention_json(g, out);
    explain_sequence_json(g, out);
    memory_json(g, plan, pipeline, out);
}

static void header_text(const ir_graph *g, const char *source_path, FILE *out) {
    int64_t ranks = ir_mesh_ranks(g);
    fprintf(out, "plan of %s (model %s)\n\n", source_path, g->model);
    fprintf(out, "mesh: ");
    if (!g->n_axes) fprintf(out, "none (one device)");
    for (int a = 0; a < g->n_axes; a++) fprintf(out, "%s%s=%lld", a ? " x " : "", g->axes[a].name, (long long)g->axes[a].size);
    fprintf(out, ", %lld rank%s\n", (long long)ranks, ranks == 1 ? "" : "s");
    if (g->n_dims) {
        fprintf(out, "dims:");
        for (int i = 0; i < g->n_dims; i++) {
            if (g->batch_dim && strcmp(g->batch_dim, g->dim_names[i]) == 0)
                fprintf(out, " %s=%lld (micro-batches of %lld)", g->dim_names[i], (long long)g->batch_whole,
                        (long long)g->dim_values[i]);
            else
                fprintf(out, " %s=%lld", g->dim_names[i], (long long)g->dim_values[i]);
        }
        fprintf(out, "\n");
    }
    fprintf(out, "\n");
}

/* Every region of the memory plan, each stage's peak and each stage's own (--explain=full). */
static void memory_text(const ir_graph *g, const dm_memory_plan *plan, const dm_pipeline_plan *pipeline, FILE *out) {
    char p[32], gr[32], s[32], a[32], au[32];
    explain_mib((double)plan->param_elems, p, sizeof p);
    explain_mib((double)plan->grad_elems, gr, sizeof gr);
    explain_mib((double)plan->state_elems, s, sizeof s);
    explain_mib((double)plan->arena_elems, a, sizeof a);
    explain_mib((double)plan->arena_unshared_elems, au, sizeof au);
    int chunked = plan->stages > plan->ranks && plan->ranks > 0;
    fprintf(out, "memory per rank%s:\n", chunked ? " (each region's largest over the ranks, which hold their chunks' stages)"
                                       : plan->stages > 1 ? " (each region's largest over the stages)" : "");
    fprintf(out, "  parameters        %12s\n", p);
    fprintf(out, "  gradients         %12s\n", gr);
    fprintf(out, "  optimizer state   %12s\n", s);
    fprintf(out, "  activations       %12s  (%s without buffer reuse; one micro-batch's)\n", a, au);
    explain_at_create(g, plan, out);
    int n_peaks = plan->stages > 1 ? plan->ranks : 1;
    for (int k = 0; k < n_peaks; k++) {
        dm_memory_peak pk;
        dm_memory_peak_of(plan, g, pipeline, plan->scratch_elems, k, &pk);
        char total[32], parts[7][32];
        explain_mib((double)pk.total / 4, total, sizeof total);
        const int64_t part[7] = {pk.params, pk.grads, pk.optimizer_state, pk.activations, pk.gradient_sums, pk.scratch,
                                 pk.outputs};
        for (int q = 0; q < 7; q++) explain_mib((double)part[q] / 4, parts[q], sizeof parts[q]);
        if (n_peaks > 1) fprintf(out, chunked ? "  rank %-4d " : "  stage %-3d ", k);
        else fprintf(out, "  ");
        fprintf(out, "peak %s allocated (%lld bytes): parameters %s, gradients %s, optimizer state %s, activations in flight "
                     "%s, gradient sums %s, scratch %s, outputs %s",
                total, (long long)pk.total, parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6]);
        if (dm_runs_2bw(g)) { /* every stage: the parts printed sum to the peak */
            char second[32], previous[32];
            explain_mib((double)pk.weight_version / 4, second, sizeof second);
            explain_mib((double)pk.previous_inputs / 4, previous, sizeof previous);
            if (g->schedule == PIPE_PIPEDREAM)
                fprintf(out, ", pipedream's stashed weight versions %s, the previous batch's inputs %s", second, previous);
            else
                fprintf(out, ", 2bw's second weight version %s, the previous batch's inputs %s", second, previous);
        }
        if (pk.gathered_outputs) {
            char gathered[32];
            explain_mib((double)pk.gathered_outputs / 4, gathered, sizeof gathered);
            fprintf(out, "; and %s of host memory once the outputs are asked for whole", gathered);
        }
        fprintf(out, "\n");
    }
    /* as the compact table says: the narrow weights are untracked, outside both peaks */
    if (g->quantize_bits)
        fprintf(out, "  peak: the f32 parameters and the forward's buffers, tracked (`dmc run --memory`'s model peak), "
                     "not the narrow weights (below)\n");
    for (int k = 0; k < plan->stages && plan->stages > 1; k++) {
        const dm_stage_memory *m = &plan->stage[k];
        explain_mib((double)m->param_elems, p, sizeof p);
        explain_mib((double)m->grad_elems, gr, sizeof gr);
        explain_mib((double)m->state_elems, s, sizeof s);
        explain_mib((double)m->held_elems, a, sizeof a);
        fprintf(out, "  stage %-3d ", k);
        if (chunked) fprintf(out, "(rank %d%c) ", k % plan->ranks, 'a' + k / plan->ranks);
        fprintf(out, "parameters %s, gradients %s, optimizer state %s, activations %s", p, gr, s, a);
        if (m->in_flight > 1 && m->kept_elems == m->arena_elems) {
            char arena[32];
            explain_mib((double)m->arena_elems, arena, sizeof arena);
            fprintf(out, " (the arena, %s, x %d micro-batches in flight)", arena, m->in_flight);
        } else if (m->in_flight > 1) {
            char working[32], kept[32];
            explain_mib((double)(m->arena_elems - m->kept_elems), working, sizeof working);
            explain_mib((double)m->kept_elems, kept, sizeof kept);
            fprintf(out, " (working buffers %s, and %s kept for the backward pass x %d micro-batches in flight)", working,
                    kept, m->in_flight);
        }
        fprintf(out, "\n");
    }
}

/* full: every parameter, collective, schedule column and ZeRO bucket on its own line;
 * otherwise what reads in a screen at any size (explain_compact.c). */
static void explain_text(const ir_graph *g, const dm_memory_plan *plan, const dm_reshard_list *reshards,
                         const dm_pipeline_plan *pipeline, const dm_zero_plan *zero, const char *source_path, int full,
                         FILE *out) {
    header_text(g, source_path, out);
    if (full) {
        list_values(g, "inputs", g->inputs, g->n_inputs, out);
        list_values(g, "params", g->params, g->n_params, out);
        list_values(g, "outputs", g->outputs, g->n_outputs, out);
    } else {
        explain_values_collapsed(g, "inputs", g->inputs, g->n_inputs, out);
        explain_values_collapsed(g, "params", g->params, g->n_params, out);
        explain_values_collapsed(g, "outputs", g->outputs, g->n_outputs, out);
    }
    if (g->loss >= 0)
        fprintf(out, "loss: %s, line %d\n", g->values[g->loss]->name ? g->values[g->loss]->name : "?",
                g->values[g->loss]->loc.line);
    if (full) list_collectives(g, reshards, zero, pipeline, out);
    else explain_collectives_grouped(g, reshards, zero, pipeline, out);
    explain_compress_text(g, full, out);
    explain_ps_text(g, out);
    explain_prune_text(g, out);
    if (pipelined(g, pipeline)) pipeline_text(g, plan, pipeline, full, out);
    explain_time_text(g, pipeline, full, out);
    if (zero && zero->n_buckets > 0) zero_text(g, zero, full, out);
    recompute_text(g, out);
    attention_text(g, full, out);
    explain_sequence_text(g, full, out);
    if (full) memory_text(g, plan, pipeline, out);
    else explain_memory_table(g, plan, pipeline, out);
    explain_quant_text(g, plan, pipeline, full, out);
}

void explain_print(const ir_graph *g, const dm_memory_plan *plan, const dm_reshard_list *reshards,
                   const dm_pipeline_plan *pipeline, const dm_zero_plan *zero, const char *source_path,
                   explain_format format, FILE *out) {
    if (format == EXPLAIN_JSON) explain_json(g, plan, reshards, pipeline, zero, source_path, out);
    else explain_text(g, plan, reshards, pipeline, zero, source_path, format == EXPLAIN_FULL, out);
}
