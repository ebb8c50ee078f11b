/* schedule.h: pipeline schedules (GPipe, 1F1B, interleaved 1F1B, PipeDream-2BW). For P stages (pipeline
 * ranks) and M micro-batches: each stage's actions in the order it runs them (forward or
 * backward of one micro-batch, on one of its model chunks), and their time slots, each
 * action starting as soon as its stage is free and its input has arrived. The model
 * is cut into V = P * chunks virtual stages; virtual stage j runs on stage j mod P, as
 * its chunk j / P (one chunk a stage but for the interleaved schedule):
 *   F(j, m) after F(j-1, m);  B(j, m) after B(j+1, m), and on the last after F(j, m).
 * Used by code generation (one action list per stage, as generated code) and --explain
 * (the grid, the bubble, activations in flight). 2BW's steps do not flush: its action
 * lists are the stream of several consecutive batches, micro-batches numbered across them. */
#ifndef DM_SCHEDULE_H
#define DM_SCHEDULE_H

#include <stdio.h>

#include "pipe_kind.h"

typedef struct pipe_action {
    char kind;        /* 'F' or 'B' */
    int micro;        /* micro-batch, 0 .. M - 1; 2BW: of the stream, batch micro / M's micro % M */
    int chunk;        /* the stage's model chunk, 0 .. chunks - 1: virtual stage chunk * P + stage */
    double start, end;
} pipe_action;

typedef struct pipe_schedule {
    pipe_kind kind;
    int stages, micros;
    int chunks;                          /* model chunks per stage: 1 but for the interleaved schedule */
    int batches;                         /* consecutive batches (steps) in the action lists: 1 but for
                                          * 2BW, whose lists are PIPE_2BW_BATCHES batches' stream */
    double forward_cost, backward_cost;  /* the same on every virtual stage (pipe_schedule_build*),
                                          * else 0 */
    double *stage_forward, *stage_backward; /* (stages * chunks) each virtual stage's costs */
    double *stage_send;    /* (stages * chunks) how long into a backward its gradient leaves for
                            * the virtual stage before (the rest, weight gradients, runs on
                            * meanwhile): the backward's cost but where given otherwise */
    pipe_action *actions;  /* (stages, pipe_actions) stage s's actions in its order */
    int *in_flight;        /* (stages * chunks) pipe_in_flight's, counted as the orders are made */
    double makespan;       /* end of the last action */
    double step;           /* a step's time: the makespan, or 2BW's in the steady state */
    double step_ends[3];   /* 2BW: when each of its steps ends on the last stage to end it (the
                            * steps end in collectives over every rank, which the next waits
                            * for); the last step's with the drain after it */
} pipe_schedule;

/* The batches 2BW's action lists hold: the first step (its warm-up), a steady one, and the
 * last with the drain after it. */
#define PIPE_2BW_BATCHES 3

/* The schedule that P stages run: one stage runs its micro-batches one after the other
 * (forward, backward, next: 1F1B with P = 1) whatever the program asked for. */
pipe_kind pipe_kind_for(int kind, int stages);
/* The model chunks a stage holds: `chunks` for the interleaved schedule on 2 or more
 * stages, else 1. */
int pipe_chunks_for(int kind, int stages, int chunks);

/* Why P stages with `chunks` chunks each cannot run M micro-batches interleaved (a
 * sentence), or NULL when they can: chunks >= 2, and M a multiple of P (micro-batches go
 * through a stage's chunks in groups of P). */
const char *pipe_interleaved_problem(int stages, int chunks, int micros);
/* Why P stages cannot run M micro-batches as 2BW or PipeDream (a sentence naming the
 * schedule), or NULL when they can: M >= P, so that the backwards a stage owes at a step's
 * end are all of the step's own batch (for 2BW, two weight versions suffice). */
const char *pipe_2bw_problem(int kind, int stages, int micros);
/* 2BW: the backwards stage s of P still owes when a step ends (of its batch's last
 * micro-batches), and runs in the next step or the drain: P - s - 1. */
static inline int pipe_2bw_owed(int stages, int stage) { return stages - stage - 1; }

/* Builds the schedule (stages >= 1, micros >= 1, costs > 0). Returns 0, or -1 when the
 * arguments are out of range or memory runs out. */
int pipe_schedule_build(pipe_schedule *s, pipe_kind kind, int stages, int micros, double forward_cost,
                        double backward_cost);
/* The same with `chunks` model chunks per stage, each virtual stage costing forward_cost
 * and backward_cost. */
int pipe_schedule_build_chunked(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                                double forward_cost, double backward_cost);
/* The same with each stage's own costs, forward[s] and backward[s] (> 0): unequal stages,
 * whose bubble the formula does not give. */
int pipe_schedule_build_staged(pipe_schedule *s, pipe_kind kind, int stages, int micros, const double *forward,
                               const double *backward);
/* The general one: each virtual stage's costs, forward[j] and backward[j] for j < stages
 * * chunks. Returns -1 also when the stages' orders wait on each other (a deadlock). */
int pipe_schedule_build_virtual(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                                const double *forward, const double *backward);
/* The same where virtual stage j's backward sends its input's gradient send[j] into its
 * cost (0 < send[j] <= backward[j]; send NULL: at its end), the stage before's backward
 * waiting on that, not on the whole backward. */
int pipe_schedule_build_sends(pipe_schedule *s, pipe_kind kind, int stages, int chunks, int micros,
                              const double *forward, const double *backward, const double *send);
void pipe_schedule_free(pipe_schedule *s);

/* Actions per stage: 2 * chunks * micros * batches. */
int pipe_actions(const pipe_schedule *s);
/* Stage s's action i (0 <= i < pipe_actions(s)). */
const pipe_action *pipe_action_at(const pipe_schedule *s, int stage, int i);

/* The idle fraction of stage-time: 1 - (work of every stage) / (stages * makespan); 2BW's
 * of a steady step (its drain is once a run: pipe_2bw_warmup). With unequal stages it
 * counts a fast stage's wait for the slow one as idle, as a trace does. */
double pipe_bubble(const pipe_schedule *s);
/* The theory: (P - 1) / (M + P - 1), the same for GPipe and 1F1B (Narayanan et al., 2021). */
double pipe_bubble_formula(int stages, int micros);
/* Interleaved with v chunks: each stage idles (P - 1) chunk-times of forward and backward
 * where 1F1B idles P - 1 stage-times, 1/v of the bubble: (1/v)(P - 1)/M of the ideal step,
 * an idle fraction (P - 1) / (v M + P - 1). v = 1 gives pipe_bubble_formula's. */
double pipe_bubble_formula_chunked(int stages, int chunks, int micros);
/* 2BW: the time a run of its batches takes beyond their steady steps (the drain after the
 * last: with equal stages (P - 1) backward times): makespan - batches * step. */
double pipe_2bw_warmup(const pipe_schedule *s);
/* 2BW with equal stages and backwards twice the forwards: each step starts on every stage
 * together, and the last waits P - 1 forwards for the first: (P - 1) / (3 M + P - 1). */
double pipe_bubble_formula_2bw(int stages, int micros);
/* The most micro-batches whose activations virtual stage j holds at once (forward done,
 * backward not yet): M for GPipe, min(P - j, M) for 1F1B and 2BW. */
int pipe_in_flight(const pipe_schedule *s, int vstage);

/* The grid, one row per stage and one column per slot of the smallest cost ("F3", "B0",
 * ". " idle; interleaved: a row per rank, "F3a", the chunk a letter), for schedules of equal stages whose
 * costs are whole multiples of the smaller one (prints nothing for others). */
void pipe_schedule_print(const pipe_schedule *s, FILE *out);

#endif
