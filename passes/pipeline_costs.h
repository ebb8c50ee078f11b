/* pipeline_costs.h: what the pipeline pass (pipeline.c) and the planner's stage estimate
 * (stage_estimate.c) share: the forward ops' costs a cut is chosen by, and the times of a
 * stage and of the update. Nothing else includes it. */
#ifndef DM_PIPELINE_COSTS_H
#define DM_PIPELINE_COSTS_H

#include <stddef.h>

#include "passes.h"

/* Per forward op, summed over the ops before it: a stage of ops [i, j) has seconds[j] -
 * seconds[i], and so on. */
typedef struct pipe_costs {
    const ir_graph *g;
    const dm_cost_model *model;
    int microbatches;       /* the step's (the graph's, or a probe's plan's): above 1, each
                             * micro-batch adds its gradients into the step's sum */
    int n;                  /* forward ops */
    int *op;                /* (n) their value ids, in order */
    double *seconds;        /* (n + 1) forward time + the time of the backward ops it originates */
    double *forward;        /* (n + 1) the forward time alone */
    double *flops;          /* (n + 1) the same in flops */
    double *activation;     /* (n + 1) elements of the op's result the backward reads */
    double *params;         /* (n + 1) elements of persistent state first used by the op: parameters,
                             * gradients and optimizer state (ZeRO's shares of them) */
    double *cross;          /* (n + 1) elements crossing the boundary before op j (0 at 0 and n) */
    double *kept_across;    /* (n + 1) of those, the ones the backward reads only after the boundary:
                             * activation counts them at their op, but a stage ending at j does not
                             * keep them, the next keeps them as received (its cross): subtracted
                             * from the former's activations. NULL: none (stage_estimate.c's) */
    double *send_tail;      /* (n + 1) time of op j's backward ops that run after the last of them
                             * the ops before j read: what a stage starting at j computes once
                             * it has sent the stage before its gradient (the code emits the
                             * backward in the graph's order, sending each value once made) */
    int *in_flight;         /* (stages) micro-batches each stage holds at once, by the schedule */
    char *layer_start;      /* (n + 1) op j starts a layer (instance or top-level value) */
    int layer_starts;       /* how many of the n - 1 inner boundaries do */
} pipe_costs;

/* calloc of at least one element, aborting when out of memory. */
void *pipe_xcalloc(size_t n, size_t size);
/* Length of the layer part of a value's name ("h.3" of "h.3.mlp.c_fc"). */
size_t pipe_layer_key(const char *name);
/* Each forward op's own costs (not yet summed), the values crossing each boundary and
 * where layers start. */
void pipe_measure_ops(const ir_graph *g, pipe_costs *c);
void pipe_costs_free(pipe_costs *c);
/* A stage holding ops [i, j): its forward and backward times. */
void pipe_stage_times(const pipe_costs *c, int i, int j, double *forward, double *backward);
/* How far into the backward of a stage starting at op i its inputs' gradient leaves. */
double pipe_send_seconds_of(const pipe_costs *c, int i, double backward);
/* The best cut into `stages` stages (boundary: stages + 1 op positions); -1 when none
 * fits the memory limit. */
int pipe_choose_cuts(const pipe_costs *c, int stages, double limit, struct dm_cut_memo *memo, int *boundary);
/* Model flops as Megatron-LM counts them (products forward and backward, not recomputed). */
double pipe_model_flops_of(const ir_value *v, const dm_op_cost *oc);
/* An update-phase op's time, its reduction's latency left out (pipeline.c says how);
 * in_shares: dm_zero_gathered_params's (may be NULL). */
double pipe_update_op_seconds(const ir_graph *g, const dm_cost_model *m, const ir_value *v, const char *in_shares,
                              double *reduced, double *steps, double *link_seconds, double *cached_seconds,
                              double *bytes);
/* A rank's update ops over `bytes`, the share in its cache at the cache's bandwidth. */
double pipe_update_seconds_of(const ir_graph *g, const dm_cost_model *m, double seconds, double cached,
                              double bytes);
/* What the update's reductions add to the update ops' own time. */
double pipe_reductions_seconds(const ir_graph *g, const dm_cost_model *m, const double *reduced, const double *steps,
                               double link_seconds, double backward, int stages, int microbatches,
                               double bucket_bytes);
/* Gradient accumulation (codegen/emit_step.c) of a parameter of `elems` gradient elements in
 * a step of `microbatches`: per micro-batch, its gradient added into the step's sum (a
 * loop reading both and writing the sum, 12 bytes an element; pipedream copies it, 8);
 * the mean of the sums into the gradients the update reads, once a step (8 bytes an
 * element; none for pipedream, which updates after each micro-batch). 0 with one
 * micro-batch; the per-micro-batch sum 0 under 16-bit precision (Megatron-LM's fused
 * accumulation, pipeline.c; dmc's own for a weight-gradient product, dm_micro_grads_in_sums,
 * which the caller leaves out). Priced as the other element-wise kernels are (cost_seconds). */
double pipe_grad_sum_seconds(const ir_graph *g, const dm_cost_model *m, int microbatches, double elems);
double pipe_grad_mean_seconds(const ir_graph *g, const dm_cost_model *m, int microbatches, double elems);
/* A stage's time for one action as the schedule simulation takes it (never 0). */
double pipe_action_seconds(double seconds);

#endif
