/* schedule.c: pipeline schedules as per-stage action lists, timed by simulation. */
#include "schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

pipe_kind pipe_kind_for(int kind, int stages) { return stages > 1 ? (pipe_kind)kind : PIPE_1F1B; }

int pipe_chunks_for(int kind, int stages, int chunks) {
    return pipe_kind_for(kind, stages) == PIPE_INTERLEAVED && chunks > 1 ? chunks : 1;
}

const char *pipe_interleaved_problem(int stages, int chunks, int micros) {
    if (chunks < 2) return "the interleaved schedule needs 2 or more model chunks per stage";
    if (micros % stages != 0) return "the interleaved schedule needs micro-batches in groups of the pipeline's stages";
    return NULL;
}

const char *pipe_2bw_problem(int kind, int stages, int micros) {
    if (micros < stages)
        return kind == PIPE_PIPEDREAM ? "pipedream needs at least as many micro-batches as pipeline stages"
                                      : "2bw needs at least as many micro-batches as pipeline stages";
    return NULL;
}

int pipe_actions(const pipe_schedule *s) { return 2 * s->chunks * s->micros * s->batches; }

const pipe_action *pipe_action_at(const pipe_schedule *s, int stage, int i) {
    return &s->actions[(size_t)stage * (size_t)pipe_actions(s) + (size_t)i];
}

static pipe_action *action_at(pipe_schedule *s, int stage, int i) {
    return &s->actions[(size_t)stage * (size_t)pipe_actions(s) + (size_t)i];
}

/* The k-th forward (or backward) of a stage's order: for GPipe and 1F1B micro-batch k of
 * its one chunk; interleaved, micro-batches go through the chunks in groups of P (P
 * micro-batches on chunk 0, the same on chunk 1, ..., then the next P), and the backwards
 * through the chunks from the last. */
static void kth(const pipe_schedule *s, int k, int backward, pipe_action *a) {
    int P = s->stages, v = s->chunks;
    a->kind = backward ? 'B' : 'F';
    if (v == 1) {
        a->micro = k, a->chunk = 0;
        return;
    }
    int group = k / P, chunk = group % v;
    a->chunk = backward ? v - 1 - chunk : chunk;
    a->micro = group / v * P + k % P;
}

/* The forwards a stage runs before its first backward. 1F1B (and 2BW, once a run): those
 * that fill the pipe below it, P - s - 1. Interleaved: a group of P on each chunk but the last while the first
 * micro-batch reaches the last virtual stage, and twice P - s - 1 more: with equal stages
 * P - s - 1 give the same step, but with stages 20% apart (random, timed here) the step
 * took up to 15% longer: the extra forwards are work a stage has at hand while it waits
 * for a slower one's gradients. */
static int warmup(const pipe_schedule *s, int stage) {
    int total = s->chunks * s->micros * s->batches;
    int n = s->kind == PIPE_GPIPE                              ? total
            : s->kind == PIPE_1F1B || pipe_flushless(s->kind)   ? s->stages - stage - 1
                                         : (s->chunks - 1) * s->stages + 2 * (s->stages - stage - 1);
    return n < total ? n : total;
}

/* Stage s's order: the warm-up forwards, then alternately one forward and one backward, then
 * the backwards left (2BW: its batches' micro-batches as one stream: no flush between them).
 * Each virtual stage's micro-batches in flight are counted on the way. */
static void order(pipe_schedule *s, int stage) {
    int total = s->chunks * s->micros * s->batches, n = 0, next_f = 0, next_b = 0, warm = warmup(s, stage);
    int *flight = s->in_flight + (size_t)stage * (size_t)s->chunks; /* by chunk, for now */
    int now[64] = {0};
    for (int c = 0; c < s->chunks; c++) flight[c] = 0;
    while (next_f < total || next_b < total) {
        int forward = next_f < warm || (next_f < total && (n - warm) % 2 == 0) || next_b >= total;
        pipe_action *a = action_at(s, stage, n++);
        kth(s, forward ? next_f++ : next_b++, !forward, a);
        now[a->chunk] += forward ? 1 : -1;
        if (now[a->chunk] > flight[a->chunk]) flight[a->chunk] = now[a->chunk];
    }
}

/* The simulation's state: every virtual stage's forwards and backwards timed so far (each
 * runs its micro-batches in order, so micro-batch m's has ended there once more than m
 * have been timed) and their ends; every stage's next action and when it is free. */
typedef struct simulation {
    pipe_schedule *s;
    int *forwards, *backwards;  /* (V) */
    double *f_end;              /* (V, M) */
    double *b_sent;             /* (V, M) when a backward's gradient left for the stage before */
    int *next;                  /* (P) */
    double *idle_from;          /* (P) */
    int *limit;                 /* (P) 2BW: the end of the step being timed in each stage's order */
    double barrier;             /* 2BW: when the step being timed starts on every stage */
} simulation;

/* Times stage st's actions from its next one on, each as soon as its input is there, up to
 * the first whose input is not. Returns how many it timed. */
static int time_stage(simulation *t, int st) {
    pipe_schedule *s = t->s;
    int P = s->stages, M = s->micros * s->batches, last = P * s->chunks - 1, n = pipe_actions(s), i = t->next[st];
    pipe_action *row = s->actions + (size_t)st * (size_t)n;
    double idle_from = t->idle_from[st], makespan = s->makespan;
    if (t->limit) n = t->limit[st];
    if (t->limit && idle_from < t->barrier) idle_from = t->barrier;
    for (; i < n; i++) {
        pipe_action *a = &row[i];
        int j = a->chunk * P + st, m = a->micro, is_forward = a->kind == 'F';
        /* an action's input: a forward's from the virtual stage before (none on the first),
         * a backward's from the one after, or on the last from its own forward */
        double ready = 0;
        if (is_forward && j > 0) {
            if (t->forwards[j - 1] <= m) break;
            ready = t->f_end[(size_t)(j - 1) * M + m];
        } else if (!is_forward) {
            int from = j == last ? j : j + 1;
            if ((j == last ? t->forwards[from] : t->backwards[from]) <= m) break;
            ready = (j == last ? t->f_end : t->b_sent)[(size_t)from * M + m];
        }
        double start = ready > idle_from ? ready : idle_from;
        double end = start + (is_forward ? s->stage_forward[j] : s->stage_backward[j]);
        a->start = start, a->end = end;
        if (is_forward) t->f_end[(size_t)j * M + m] = end;
        else t->b_sent[(size_t)j * M + m] = start + s->stage_send[j];
        (is_forward ? t->forwards : t->backwards)[j]++;
        idle_from = end;
        if (end > makespan) makespan = end;
    }
    int timed = i - t->next[st];
    t->next[st] = i, t->idle_from[st] = idle_from;
    s->makespan = makespan;
    return timed;
}

/* Times every action; -1 when the orders wait on each other. The passes go down the stages
 * and back up in turn: forwards wait on the stage before, backwards on the stage after,
 * and a pass carries its direction's news through every stage (one way only, the
 * backwards of a GPipe schedule took a pass per stage). Any order gives the same times:
 * each action's depends only on the actions it waits on. */
static int simulate(pipe_schedule *s) {
    size_t V = (size_t)s->stages * (size_t)s->chunks, all = (size_t)s->stages * (size_t)pipe_actions(s);
    size_t micros = (size_t)s->micros * (size_t)s->batches;
    simulation t = {.s = s};
    t.forwards = calloc(V, sizeof(int)), t.backwards = calloc(V, sizeof(int));
    t.f_end = malloc(V * micros * sizeof(double)), t.b_sent = malloc(V * micros * sizeof(double));
    t.next = calloc((size_t)s->stages, sizeof(int)), t.idle_from = calloc((size_t)s->stages, sizeof(double));
    /* 2BW's steps end in collectives over every rank (the step's loss, a host's agreement
     * on whether to go on): a step starts on every stage once the last has ended the one
     * before, so its steps are timed one after the other */
    if (pipe_flushless(s->kind)) t.limit = calloc((size_t)s->stages, sizeof(int));
    int status = t.forwards && t.backwards && t.f_end && t.b_sent && t.next && t.idle_from &&
                         (!pipe_flushless(s->kind) || t.limit)
                     ? 0
                     : -1;
    for (int step = 0; !status && step < s->batches; step++) {
        size_t until = all;
        if (t.limit) {
            until = 0;
            for (int st = 0; st < s->stages; st++) {
                /* step k ends before the forward of batch k + 1's micro-batch 0 */
                int w = s->stages - st - 1, end = step + 1 < s->batches ? 2 * (step + 1) * s->micros - w : pipe_actions(s);
                t.limit[st] = end;
                until += (size_t)end;
            }
            t.barrier = s->makespan;
        }
        for (size_t timed = 0, pass = 0; !status && timed < until; pass++) {
            size_t before = timed;
            timed = 0;
            for (int q = 0; q < s->stages; q++) time_stage(&t, pass % 2 ? s->stages - 1 - q : q);
            for (int q = 0; q < s->stages; q++) timed += (size_t)t.next[q];
            if (timed == before) status = -1;
        }
        if (t.limit) s->step_ends[step] = s->makespan;
    }
    free(t.forwards), free(t.backwards), free(t.f_end), free(t.b_sent), free(t.next), free(t.idle_from), free(t.limit);
    return status;
}

int pipe_schedule_build_virtual(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                                const double *forward, const double *backward) {
    return pipe_schedule_build_sends(s, kind, stages, chunks, micros, forward, backward, NULL);
}

int pipe_schedule_build_sends(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                              const double *forward, const double *backward, const double *send) {
    memset(s, 0, sizeof *s);
    if (stages < 1 || micros < 1 || chunks < 1 || chunks > 64 || stages > 4096 || micros > 65536) return -1;
    if ((chunks > 1) != (kind == PIPE_INTERLEAVED) || (chunks > 1 && pipe_interleaved_problem(stages, chunks, micros)))
        return -1;
    if (pipe_flushless(kind) && pipe_2bw_problem(kind, stages, micros)) return -1;
    size_t V = (size_t)stages * (size_t)chunks;
    for (size_t j = 0; j < V; j++)
        if (!(forward[j] > 0) || !(backward[j] > 0) || (send && !(send[j] > 0 && send[j] <= backward[j]))) return -1;
    s->kind = kind, s->stages = stages, s->micros = micros, s->chunks = chunks;
    s->batches = pipe_flushless(kind) ? PIPE_2BW_BATCHES : 1;
    s->stage_forward = malloc(V * sizeof(double));
    s->stage_backward = malloc(V * sizeof(double));
    s->stage_send = malloc(V * sizeof(double));
    /* every field of every action is written below: order() the kinds, the timing the rest */
    s->actions = malloc((size_t)stages * (size_t)pipe_actions(s) * sizeof *s->actions);
    s->in_flight = malloc(V * sizeof(int));
    int status = s->stage_forward && s->stage_backward && s->stage_send && s->actions && s->in_flight ? 0 : -1;
    if (!status) {
        memcpy(s->stage_forward, forward, V * sizeof(double));
        memcpy(s->stage_backward, backward, V * sizeof(double));
        memcpy(s->stage_send, send ? send : backward, V * sizeof(double));
        for (int st = 0; st < stages; st++) order(s, st);
        /* order() counted by stage and chunk; the table is by virtual stage */
        int *by_chunk = malloc(V * sizeof(int));
        status = by_chunk ? 0 : -1;
        for (size_t q = 0; by_chunk && q < V; q++) by_chunk[q] = s->in_flight[q];
        for (int st = 0; by_chunk && st < stages; st++)
            for (int c = 0; c < chunks; c++) s->in_flight[c * stages + st] = by_chunk[st * chunks + c];
        free(by_chunk);
    }
    if (!status) status = simulate(s);
    /* 2BW: its middle step, which starts with a previous batch's backwards owed */
    if (!status) s->step = pipe_flushless(kind) ? s->step_ends[1] - s->step_ends[0] : s->makespan;
    if (status) pipe_schedule_free(s);
    return status;
}

int pipe_schedule_build_staged(pipe_schedule *s, pipe_kind kind, int stages, int micros, const double *forward,
                               const double *backward) {
    return pipe_schedule_build_virtual(s, kind, stages, 1, micros, forward, backward);
}

int pipe_schedule_build_chunked(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                                double forward_cost, double backward_cost) {
    memset(s, 0, sizeof *s);
    if (stages < 1 || stages > 4096 || chunks < 1 || chunks > 64) return -1;
    size_t V = (size_t)stages * (size_t)chunks;
    double *forward = malloc(V * sizeof(double)), *backward = malloc(V * sizeof(double));
    int status = forward && backward ? 0 : -1;
    for (size_t j = 0; !status && j < V; j++) forward[j] = forward_cost, backward[j] = backward_cost;
    if (!status) status = pipe_schedule_build_virtual(s, kind, stages, chunks, micros, forward, backward);
    if (!status) s->forward_cost = forward_cost, s->backward_cost = backward_cost;
    free(forward);
    free(backward);
    return status;
}

int pipe_schedule_build(pipe_schedule *s, pipe_kind kind, int stages, int micros, double forward_cost,
                        double backward_cost) {
    return pipe_schedule_build_chunked(s, kind, stages, 1, micros, forward_cost, backward_cost);
}

void pipe_schedule_free(pipe_schedule *s) {
    free(s->stage_send);
    free(s->actions);
    free(s->in_flight);
    free(s->stage_forward);
    free(s->stage_backward);
    s->actions = NULL;
    s->in_flight = NULL;
    s->stage_forward = s->stage_backward = s->stage_send = NULL;
}

double pipe_bubble(const pipe_schedule *s) {
    double work = 0;
    for (int j = 0; j < s->stages * s->chunks; j++) work += (double)s->micros * (s->stage_forward[j] + s->stage_backward[j]);
    return 1.0 - work / ((double)s->stages * s->step);
}

double pipe_2bw_warmup(const pipe_schedule *s) { return s->makespan - s->batches * s->step; }

double pipe_bubble_formula_2bw(int stages, int micros) { return (stages - 1.0) / (3.0 * micros + stages - 1); }

double pipe_bubble_formula(int stages, int micros) { return pipe_bubble_formula_chunked(stages, 1, micros); }

double pipe_bubble_formula_chunked(int stages, int chunks, int micros) {
    return (double)(stages - 1) / ((double)chunks * micros + stages - 1);
}

int pipe_in_flight(const pipe_schedule *s, int vstage) { return s->in_flight[vstage]; }

void pipe_schedule_print(const pipe_schedule *s, FILE *out) {
    if (!(s->forward_cost > 0)) return;
    double unit = s->forward_cost < s->backward_cost ? s->forward_cost : s->backward_cost;
    int slots = (int)lround(s->makespan / unit), digits = s->micros * s->batches > 10 ? 2 : 1;
    int width = 1 + digits + (s->chunks > 1); /* kind, micro-batch, chunk letter */
    char *row = malloc((size_t)slots * (size_t)(width + 1) + 1);
    if (!row) return;
    for (int st = 0; st < s->stages; st++) {
        size_t len = (size_t)slots * (size_t)(width + 1);
        memset(row, ' ', len);
        row[len] = 0;
        for (int t = 0; t < slots; t++) row[(size_t)t * (width + 1)] = '.';
        for (int i = 0; i < pipe_actions(s); i++) {
            const pipe_action *a = pipe_action_at(s, st, i);
            for (int t = (int)lround(a->start / unit); t < (int)lround(a->end / unit); t++) {
                char cell[24];
                if (s->chunks > 1) snprintf(cell, sizeof cell, "%c%d%c%*s", a->kind, a->micro, 'a' + a->chunk, width, "");
                else snprintf(cell, sizeof cell, "%c%-*d", a->kind, width - 1, a->micro);
                memcpy(row + (size_t)t * (width + 1), cell, (size_t)width);
            }
        }
        while (len > 0 && row[len - 1] == ' ') row[--len] = 0;
        /* interleaved, a row is a rank's: its chunks are stages of their own */
        fprintf(out, s->chunks > 1 ? "  rank %-4d %s\n" : "  stage %-3d %s\n", st, row);
    }
    free(row);
}
