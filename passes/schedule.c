/* schedule.c: pipeline schedules as per-stage action lists, timed by simulation. */
#include "schedule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int pipe_kind_by_name(const char *name) {
    if (strcmp(name, "gpipe") == 0) return PIPE_GPIPE;
    if (strcmp(name, "1f1b") == 0) return PIPE_1F1B;
    return -1;
}

pipe_kind pipe_kind_for(int kind, int stages) { return stages > 1 ? (pipe_kind)kind : PIPE_1F1B; }

const char *pipe_kind_name(pipe_kind kind) { return kind == PIPE_GPIPE ? "gpipe" : "1f1b"; }

const pipe_action *pipe_action_at(const pipe_schedule *s, int stage, int i) {
    return &s->actions[(size_t)stage * 2 * (size_t)s->micros + (size_t)i];
}

static pipe_action *action_at(pipe_schedule *s, int stage, int i) {
    return &s->actions[(size_t)stage * 2 * (size_t)s->micros + (size_t)i];
}

/* Stage s's order. 1F1B: the forwards that fill the pipe below it (P - s - 1, at most M),
 * then alternately one forward and one backward, then the backwards left. Its micro-batches
 * in flight are counted on the way. */
static void order(pipe_schedule *s, int stage) {
    int M = s->micros, n = 0, next_f = 0, next_b = 0;
    int warmup = s->kind == PIPE_GPIPE ? M : s->stages - stage - 1;
    if (warmup > M) warmup = M;
    while (next_f < warmup) {
        pipe_action *f = action_at(s, stage, n++);
        f->kind = 'F', f->micro = next_f++;
    }
    int most = next_f;
    while (next_f < M) {
        pipe_action *f = action_at(s, stage, n++), *b = action_at(s, stage, n++);
        f->kind = 'F', f->micro = next_f++;
        b->kind = 'B', b->micro = next_b++;
        if (next_f - next_b + 1 > most) most = next_f - next_b + 1;
    }
    while (next_b < M) {
        pipe_action *b = action_at(s, stage, n++);
        b->kind = 'B', b->micro = next_b++;
    }
    s->in_flight[stage] = most;
}

/* A stage's progress through its actions. A stage runs its forwards in micro-batch order,
 * and its backwards: micro-batch m's has ended there once more than m have been timed. */
typedef struct stage_clock {
    int next;                  /* its next action to time */
    int forwards, backwards;   /* how many of each are timed */
    double idle_from;          /* the end of the last one timed */
} stage_clock;

/* Times stage st's actions from its next one on, each as soon as its input is there, up to
 * the first whose input is not; f_end and b_end: (stages, micros) ends of the forwards and
 * backwards timed. Returns how many it timed. */
static int time_stage(pipe_schedule *s, int st, const double *forward, const double *backward, double *f_end,
                      double *b_end, stage_clock *clocks) {
    int M = s->micros, last = st == s->stages - 1;
    stage_clock *own = &clocks[st];
    pipe_action *row = s->actions + (size_t)st * 2 * (size_t)M;
    double *own_f = f_end + (size_t)st * M, *own_b = b_end + (size_t)st * M;
    /* an action's input: a forward's from the stage before (none on the first), a
     * backward's from the stage after, or on the last stage from its own forward; the
     * neighbours do not move while this stage is timed */
    const double *forward_in = st > 0 ? own_f - M : NULL, *backward_in = last ? own_f : own_b + M;
    int forwards_in = st > 0 ? clocks[st - 1].forwards : M, backwards_in = last ? 0 : clocks[st + 1].backwards;
    int forwards = own->forwards, backwards = own->backwards, i = own->next;
    double forward_cost = forward[st], backward_cost = backward[st], idle_from = own->idle_from, makespan = s->makespan;
    for (; i < 2 * M; i++) {
        pipe_action *a = &row[i];
        int is_forward = a->kind == 'F', m = a->micro;
        if (m >= (is_forward ? forwards_in : last ? forwards : backwards_in)) break;
        double ready = is_forward ? (forward_in ? forward_in[m] : 0.0) : backward_in[m];
        double start = ready > idle_from ? ready : idle_from, end = start + (is_forward ? forward_cost : backward_cost);
        a->start = start, a->end = end;
        if (is_forward) own_f[m] = end, forwards++;
        else own_b[m] = end, backwards++;
        idle_from = end;
        if (end > makespan) makespan = end;
    }
    int timed = i - own->next;
    own->next = i, own->forwards = forwards, own->backwards = backwards, own->idle_from = idle_from;
    s->makespan = makespan;
    return timed;
}

int pipe_schedule_build(pipe_schedule *s, pipe_kind kind, int stages, int micros, double forward_cost,
                        double backward_cost) {
    memset(s, 0, sizeof *s);
    if (stages < 1 || stages > 4096) return -1;
    double *forward = malloc((size_t)stages * sizeof(double)), *backward = malloc((size_t)stages * sizeof(double));
    int status = forward && backward ? 0 : -1;
    for (int st = 0; !status && st < stages; st++) forward[st] = forward_cost, backward[st] = backward_cost;
    if (!status) status = pipe_schedule_build_staged(s, kind, stages, micros, forward, backward);
    if (!status) s->forward_cost = forward_cost, s->backward_cost = backward_cost;
    free(forward);
    free(backward);
    return status;
}

int pipe_schedule_build_staged(pipe_schedule *s, pipe_kind kind, int stages, int micros, const double *forward,
                               const double *backward) {
    memset(s, 0, sizeof *s);
    if (stages < 1 || micros < 1 || stages > 4096 || micros > 65536) return -1;
    for (int st = 0; st < stages; st++)
        if (!(forward[st] > 0) || !(backward[st] > 0)) return -1;
    s->kind = kind, s->stages = stages, s->micros = micros;
    s->stage_forward = malloc((size_t)stages * sizeof(double));
    s->stage_backward = malloc((size_t)stages * sizeof(double));
    if (!s->stage_forward || !s->stage_backward) {
        pipe_schedule_free(s);
        return -1;
    }
    memcpy(s->stage_forward, forward, (size_t)stages * sizeof(double));
    memcpy(s->stage_backward, backward, (size_t)stages * sizeof(double));
    size_t n = (size_t)stages * (size_t)micros;
    /* every field of every action is written below: order() the kinds, the timing the rest */
    s->actions = malloc(2 * n * sizeof *s->actions);
    s->in_flight = malloc((size_t)stages * sizeof(int));
    double *f_end = malloc(n * sizeof(double)), *b_end = malloc(n * sizeof(double));
    stage_clock *clocks = calloc((size_t)stages, sizeof *clocks);
    int status = s->actions && s->in_flight && f_end && b_end && clocks ? 0 : -1;
    for (int st = 0; !status && st < stages; st++) order(s, st);
    /* time the actions stage by stage, each as soon as its input is there; a pass that
     * times nothing means the orders wait on each other (cannot happen for these two). The
     * passes go down the stages and back up in turn: forwards wait on the stage before,
     * backwards on the stage after, and a pass carries its direction's news through every
     * stage (one way only, the backwards of a GPipe schedule took a pass per stage). Any
     * order gives the same times: each action's depends only on the actions it waits on. */
    for (size_t timed = 0, pass = 0; !status && timed < 2 * n; pass++) {
        size_t before = timed;
        for (int q = 0; q < stages; q++) {
            int st = pass % 2 ? stages - 1 - q : q;
            timed += (size_t)time_stage(s, st, forward, backward, f_end, b_end, clocks);
        }
        if (timed == before) status = -1;
    }
    free(f_end);
    free(b_end);
    free(clocks);
    if (status) pipe_schedule_free(s);
    return status;
}

void pipe_schedule_free(pipe_schedule *s) {
    free(s->actions);
    free(s->in_flight);
    free(s->stage_forward);
    free(s->stage_backward);
    s->actions = NULL;
    s->in_flight = NULL;
    s->stage_forward = s->stage_backward = NULL;
}

double pipe_bubble(const pipe_schedule *s) {
    double work = 0;
    for (int st = 0; st < s->stages; st++) work += (double)s->micros * (s->stage_forward[st] + s->stage_backward[st]);
    return 1.0 - work / ((double)s->stages * s->makespan);
}

double pipe_bubble_formula(int stages, int micros) { return (double)(stages - 1) / (double)(micros + stages - 1); }

int pipe_in_flight(const pipe_schedule *s, int stage) { return s->in_flight[stage]; }

void pipe_schedule_print(const pipe_schedule *s, FILE *out) {
    if (!(s->forward_cost > 0)) return;
    double unit = s->forward_cost < s->backward_cost ? s->forward_cost : s->backward_cost;
    int slots = (int)lround(s->makespan / unit);
    int width = s->micros > 10 ? 3 : 2;
    char *row = malloc((size_t)slots * (size_t)(width + 1) + 1);
    if (!row) return;
    for (int st = 0; st < s->stages; st++) {
        size_t len = (size_t)slots * (size_t)(width + 1);
        memset(row, ' ', len);
        row[len] = 0;
        for (int t = 0; t < slots; t++) row[(size_t)t * (width + 1)] = '.';
        for (int i = 0; i < 2 * s->micros; i++) {
            const pipe_action *a = pipe_action_at(s, st, i);
            for (int t = (int)lround(a->start / unit); t < (int)lround(a->end / unit); t++) {
                char cell[16];
                snprintf(cell, sizeof cell, "%c%-*d", a->kind, width - 1, a->micro);
                memcpy(row + (size_t)t * (width + 1), cell, (size_t)width);
            }
        }
        while (len > 0 && row[len - 1] == ' ') row[--len] = 0;
        fprintf(out, "  stage %-3d %s\n", st, row);
    }
    free(row);
}
