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
 * then alternately one forward and one backward, then the backwards left. */
static void order(pipe_schedule *s, int stage) {
    int M = s->micros, n = 0, next_f = 0, next_b = 0;
    int warmup = s->kind == PIPE_GPIPE ? M : s->stages - stage - 1;
    if (warmup > M) warmup = M;
    while (next_f < warmup) {
        pipe_action *f = action_at(s, stage, n++);
        f->kind = 'F', f->micro = next_f++;
    }
    while (next_f < M) {
        pipe_action *f = action_at(s, stage, n++), *b = action_at(s, stage, n++);
        f->kind = 'F', f->micro = next_f++;
        b->kind = 'B', b->micro = next_b++;
    }
    while (next_b < M) {
        pipe_action *b = action_at(s, stage, n++);
        b->kind = 'B', b->micro = next_b++;
    }
}

/* When the input of stage's action a has arrived (-1: not yet known). */
static double ready_at(const pipe_schedule *s, const double *f_end, const double *b_end, int stage, const pipe_action *a) {
    int M = s->micros;
    if (a->kind == 'F') return stage == 0 ? 0.0 : f_end[(size_t)(stage - 1) * M + a->micro];
    if (stage == s->stages - 1) return f_end[(size_t)stage * M + a->micro];
    return b_end[(size_t)(stage + 1) * M + a->micro];
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
    s->actions = calloc(2 * n, sizeof *s->actions);
    double *f_end = malloc(n * sizeof(double)), *b_end = malloc(n * sizeof(double));
    int *next = calloc((size_t)stages, sizeof(int));        /* (stages) next action to time */
    double *free_at = calloc((size_t)stages, sizeof(double)); /* (stages) */
    int status = s->actions && f_end && b_end && next && free_at ? 0 : -1;
    for (size_t i = 0; !status && i < n; i++) f_end[i] = b_end[i] = -1.0;
    for (int st = 0; !status && st < stages; st++) order(s, st);
    /* time the actions stage by stage, each as soon as its input is there; a pass that
     * times nothing means the orders wait on each other (cannot happen for these two) */
    for (size_t timed = 0; !status && timed < 2 * n;) {
        size_t before = timed;
        for (int st = 0; st < stages; st++) {
            while (next[st] < 2 * micros) {
                pipe_action *a = action_at(s, st, next[st]);
                double ready = ready_at(s, f_end, b_end, st, a);
                if (ready < 0) break;
                a->start = ready > free_at[st] ? ready : free_at[st];
                a->end = a->start + (a->kind == 'F' ? forward[st] : backward[st]);
                free_at[st] = a->end;
                (a->kind == 'F' ? f_end : b_end)[(size_t)st * micros + a->micro] = a->end;
                if (a->end > s->makespan) s->makespan = a->end;
                next[st]++;
                timed++;
            }
        }
        if (timed == before) status = -1;
    }
    free(f_end);
    free(b_end);
    free(next);
    free(free_at);
    if (status) pipe_schedule_free(s);
    return status;
}

void pipe_schedule_free(pipe_schedule *s) {
    free(s->actions);
    free(s->stage_forward);
    free(s->stage_backward);
    s->actions = NULL;
    s->stage_forward = s->stage_backward = NULL;
}

double pipe_bubble(const pipe_schedule *s) {
    double work = 0;
    for (int st = 0; st < s->stages; st++) work += (double)s->micros * (s->stage_forward[st] + s->stage_backward[st]);
    return 1.0 - work / ((double)s->stages * s->makespan);
}

double pipe_bubble_formula(int stages, int micros) { return (double)(stages - 1) / (double)(micros + stages - 1); }

int pipe_in_flight(const pipe_schedule *s, int stage) {
    int held = 0, most = 0;
    for (int i = 0; i < 2 * s->micros; i++) {
        held += pipe_action_at(s, stage, i)->kind == 'F' ? 1 : -1;
        if (held > most) most = held;
    }
    return most;
}

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
