/* schedule.h: pipeline schedules (GPipe, 1F1B). For P stages and M micro-batches: each
 * stage's actions in the order it runs them (forward or backward of one micro-batch),
 * and their time slots when a forward costs f and a backward b units, each action
 * starting as soon as its stage is free and its input has arrived:
 *   F(s, m) after F(s-1, m);  B(s, m) after B(s+1, m), and on the last stage after F(s, m).
 * Used by code generation (one action list per stage, as generated code) and --explain
 * (the grid, the bubble, activations in flight). */
#ifndef DM_SCHEDULE_H
#define DM_SCHEDULE_H

#include <stdio.h>

typedef enum pipe_kind {
    PIPE_GPIPE,   /* every forward, then every backward (Huang et al., 2019) */
    PIPE_1F1B,    /* PipeDream-flush: P - s - 1 forwards, then one forward one backward, then the rest */
} pipe_kind;

typedef struct pipe_action {
    char kind;        /* 'F' or 'B' */
    int micro;        /* micro-batch, 0 .. M - 1 */
    double start, end;
} pipe_action;

typedef struct pipe_schedule {
    pipe_kind kind;
    int stages, micros;
    double forward_cost, backward_cost;   /* the same on every stage (pipe_schedule_build),
                                           * else 0 */
    double *stage_forward, *stage_backward; /* (stages) each stage's costs */
    pipe_action *actions;  /* (stages, 2 * micros): stage s's actions in its order */
    int *in_flight;        /* (stages) pipe_in_flight's, counted as the orders are made */
    double makespan;       /* end of the last action */
} pipe_schedule;

/* The schedule that P stages run: one stage runs its micro-batches one after the other
 * (forward, backward, next: 1F1B with P = 1) whatever the program asked for. */
pipe_kind pipe_kind_for(int kind, int stages);

/* "gpipe" / "1f1b" to the kind; -1 for anything else. */
int pipe_kind_by_name(const char *name);
const char *pipe_kind_name(pipe_kind kind);

/* Builds the schedule (stages >= 1, micros >= 1, costs > 0). Returns 0, or -1 when the
 * arguments are out of range or memory runs out. */
int pipe_schedule_build(pipe_schedule *s, pipe_kind kind, int stages, int micros, double forward_cost,
                        double backward_cost);
/* The same with each stage's own costs, forward[s] and backward[s] (> 0): unequal stages,
 * whose bubble the formula does not give. */
int pipe_schedule_build_staged(pipe_schedule *s, pipe_kind kind, int stages, int micros, const double *forward,
                               const double *backward);
void pipe_schedule_free(pipe_schedule *s);

/* Stage s's action i (0 <= i < 2 * micros). */
const pipe_action *pipe_action_at(const pipe_schedule *s, int stage, int i);

/* The idle fraction of stage-time: 1 - (work of every stage) / (stages * makespan). With
 * unequal stages it counts a fast stage's wait for the slow one as idle, as a trace does. */
double pipe_bubble(const pipe_schedule *s);
/* The theory: (P - 1) / (M + P - 1), the same for both schedules (Narayanan et al., 2021). */
double pipe_bubble_formula(int stages, int micros);
/* The most micro-batches whose activations stage s holds at once (forward done, backward
 * not yet): M for GPipe, min(P - s, M) for 1F1B. */
int pipe_in_flight(const pipe_schedule *s, int stage);

/* The grid, one row per stage and one column per slot of the smallest cost ("F3", "B0",
 * ". " idle), for schedules of equal stages whose costs are whole multiples of the
 * smaller one (prints nothing for others). */
void pipe_schedule_print(const pipe_schedule *s, FILE *out);

#endif
