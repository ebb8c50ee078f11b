/* dmrt_ps.h: parameter servers, a data-parallel mode of libdmrt (docs/parallelism.md,
 * "Parameter servers"). The run's world ranks [0, workers) train: each computes the
 * gradients of its share of the batch and, in place of the gradient allreduce and the
 * optimizer's update, pushes them to the servers and pulls the parameters back. World
 * ranks [workers, workers + servers) serve: each holds one shard of the parameters (the
 * parameters laid end to end in declaration order, cut into `servers` equal pieces) and
 * that shard's optimizer state, and updates it with the gradients pushed to it.
 *
 *   synchronous (staleness < 0)  a server sums the workers' pushes of a step in worker
 *       order ((g0 + g1) + g2 ...: the order of dmrt_allreduce_sum) and updates once:
 *       bit for bit the parameters of allreduce data parallelism.
 *   asynchronous (staleness K >= 0)  a server applies each push as it comes, as an update
 *       of its own, and answers a worker's pull once no worker is more than K steps behind
 *       it: a worker at step t computes on parameters that hold every update of steps up
 *       to t - K - 1 and some of the later ones.
 *
 * Messages go over the world on channels of their own (dmrt_send_tagged). Worker 0 starts
 * the servers with their shards of its parameters (and of a checkpoint's optimizer state:
 * dmrt_ps_start) before its first push; a checkpoint reads the shards back
 * (dmrt_ps_snapshot). Every wait has the communicators' deadline (a server waits that
 * long for a push at most).
 */
#ifndef DMRT_PS_H
#define DMRT_PS_H

#include <stdint.h>

#include "dmrt_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A parameter where the worker keeps it: numel floats at param_at of its parameters and
 * at grad_at of its gradients. */
typedef struct dmrt_ps_segment {
    int64_t param_at, grad_at, numel;
} dmrt_ps_segment;

/* What one update of a shard needs besides the tensors; named ctx in the update function
 * so that the optimizer's code reads as it does in a model (ctx->step, ctx->lr). */
typedef struct dmrt_ps_step {
    int64_t step;  /* the updates of this shard so far, this one included (1, 2, ...) */
    double lr;     /* the pushing worker's learning rate for its step */
    int threads;   /* the server's loops run on this many threads */
} dmrt_ps_step;

/* The optimizer's update of n elements: param, its gradient, and state[0..states) (each
 * n floats, zero before the first update). Generated with the model (<model>_ps_update). */
typedef void (*dmrt_ps_update_fn)(const dmrt_ps_step *ctx, float *param, const float *grad, float *const *state,
                                  int64_t n);

typedef struct dmrt_ps_layout {
    int workers, servers;
    int staleness;                      /* < 0: synchronous; else asynchronous, this bound */
    int n_segments;
    const dmrt_ps_segment *segments;    /* (n_segments), declaration order */
    int states;                         /* optimizer state floats per parameter float: 0..2 */
    dmrt_ps_update_fn update;
} dmrt_ps_layout;

/* Elements of the parameters laid end to end, and server s's shard of them: [*begin,
 * *end). */
int64_t dmrt_ps_total(const dmrt_ps_layout *L);
void dmrt_ps_shard(const dmrt_ps_layout *L, int s, int64_t *begin, int64_t *end);

/* Worker 0, before any other call of a worker: each server's shard of the parameters (at
 * the segments' param_at of params) and of the optimizer state, with the updates the
 * servers count as done. states: the state of the parameters laid end to end, state k of
 * element e at states[k * dmrt_ps_total(L) + e] (a checkpoint's, as dmrt_ps_snapshot gives
 * it); NULL: zeros, as before a first update. The other workers: nothing (returns 0). So
 * a host may load or set parameters, or a checkpoint, before the first step; after it the
 * servers own them. 0, or DMRT_ERR_COMM with the message in dmrt_rank_error. */
int dmrt_ps_start(dmrt_rank *r, const dmrt_ps_layout *L, const float *params, const float *states, int64_t updates);
/* A worker's step: pushes grads (at the segments' grad_at) to every server with its step
 * and learning rate and pulls the shards' parameters into params (at param_at). grads
 * NULL: a step fp16's loss scaler skipped on this worker (asynchronous servers only: the
 * synchronous ones skip a step on every worker, which then pushes nothing), sent as a
 * push without gradients that the servers count as the worker's step (the staleness
 * bound is in steps) and apply nothing of; the parameters are pulled as after any
 * step. 0, or DMRT_ERR_COMM with the message in dmrt_rank_error. */
int dmrt_ps_exchange(dmrt_rank *r, const dmrt_ps_layout *L, const float *grads, float *params, int64_t step, double lr);
/* A checkpoint's view of the servers, between steps: every worker calls it after the
 * same step (step: its count, which synchronous servers check). A server answers once
 * every worker still training has asked, so its shard then holds every push made before
 * (asynchronous servers too). Into params (at param_at): the servers' parameters, as a
 * pull; into states (NULL: not wanted; else states x dmrt_ps_total floats, laid out as
 * dmrt_ps_start takes them): their optimizer state; *updates: the updates each server
 * has made (a checkpoint's, counted on from the one the run started from). 0, or
 * DMRT_ERR_COMM. */
int dmrt_ps_snapshot(dmrt_rank *r, const dmrt_ps_layout *L, int64_t step, float *params, float *states, int64_t *updates);
/* A worker is done: the servers stop once every worker is. */
int dmrt_ps_finish(dmrt_rank *r, const dmrt_ps_layout *L);
/* dmrt_ps_finish, then, once every worker is done, the servers' final parameters into
 * params: asynchronous servers may apply the other workers' last pushes after this
 * worker's last pull, and the weights a run saves are to hold every push (synchronous
 * ones pull what the last exchange did). No exchange after it. */
int dmrt_ps_finish_pull(dmrt_rank *r, const dmrt_ps_layout *L, float *params);

/* What a server did. */
typedef struct dmrt_ps_stats {
    int staleness;          /* the layout's: < 0 synchronous */
    int64_t updates;        /* updates of its shard in this run (a resumed run's servers count on
                             * from the checkpoint's for the optimizer) */
    int64_t pushes;         /* pushes received, the skipped included */
    int64_t skipped;        /* asynchronous: pushes of steps fp16's loss scaler skipped (no
                             * gradients, no update) */
    int64_t max_lead;       /* asynchronous: the most steps a worker was ahead of the
                             * slowest when its pull was answered (at most the bound) */
    double waited_seconds;  /* time spent waiting for pushes */
    int threads;            /* the update's loops ran on */
} dmrt_ps_stats;

/* Serves shard dmrt_rank_id(r) - workers until every worker is done. threads: for the
 * update's loops. 0, or DMRT_ERR_COMM with the message in dmrt_rank_error (also when out
 * of memory). */
int dmrt_ps_serve(dmrt_rank *r, const dmrt_ps_layout *L, int threads, dmrt_ps_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
