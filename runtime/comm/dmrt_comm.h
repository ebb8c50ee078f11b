/* dmrt_comm.h: communicators of libdmrt. One interface, two backends.
 *
 * Generated code runs SPMD: every rank runs the same function with its own dmrt_rank.
 * A rank sits on a mesh of named axes (`data`, `tensor`, `pipe`, ...) and owns one
 * communicator per axis: the ranks that differ from it only along that axis. Collectives
 * are float32, blocking, and called by every rank of the communicator in the same order
 * (as in MPI). Backends:
 *
 *   threads  N ranks as threads of one process, collectives in shared memory
 *            (library dmrt_comm, pthreads only): dmrt_threads_run.
 *   MPI      one rank per process under mpirun (library dmrt_comm_mpi): dmrt_mpi_run.
 *
 * Results are deterministic and identical on every rank of a communicator: both backends
 * sum in communicator-rank order, element by element, so an allreduce is bit for bit the
 * serial sum ((x0 + x1) + x2) + ... whatever the timing and whichever backend.
 *
 * Failure is never a silent hang. Every wait has a deadline (dmrt_rank_set_timeout,
 * default 120 s or $DMRT_COMM_TIMEOUT); a rank that fails calls dmrt_rank_abort and every
 * other rank's pending or later collective fails within about a second with
 * "rank R failed: <message>". Functions return 0 or DMRT_ERR_COMM; the message is in
 * dmrt_rank_error. See docs/comm.md.
 */
#ifndef DMRT_COMM_H
#define DMRT_COMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status of a failed communicator call (dmrt.h's codes are 0..5). If dmrt.h defines it
 * too, it must use #define (or guard its enum) so that both headers agree. */
#ifndef DMRT_ERR_COMM
#define DMRT_ERR_COMM 6
#endif

/* At most this many mesh axes; axis names are at most DMRT_MESH_NAME_MAX - 1 bytes. */
#define DMRT_MESH_MAX_AXES 8
#define DMRT_MESH_NAME_MAX 32

/* One rank's view of the run: world rank and size, mesh coordinates, one communicator
 * per mesh axis, the current step (for messages), the deadline and the last error.
 * Created by a launcher and passed to rank_main; owned by the launcher. */
typedef struct dmrt_rank dmrt_rank;

/* A group of ranks that run collectives together: the world, or one mesh axis. Owned
 * by its dmrt_rank. Called from one thread only: the rank's own (started allreduces run
 * on a helper the library owns). */
typedef struct dmrt_comm dmrt_comm;

/* ---- the rank ------------------------------------------------------------------------ */

/* World rank of r, in 0 .. dmrt_rank_count(r) - 1. */
int dmrt_rank_id(const dmrt_rank *r);
/* Number of ranks in the run (the world size). */
int dmrt_rank_count(const dmrt_rank *r);
/* "threads" or "mpi". */
const char *dmrt_rank_backend(const dmrt_rank *r);
/* Ranks of the run on this machine, r's included: every rank with the threads backend;
 * with MPI, the launcher's count for the node (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE,
 * MPICH's MPI_LOCALNRANKS), else 1. They share its cores (dmrt_threads_per_rank). */
int dmrt_rank_local_count(const dmrt_rank *r);

/* The training step that r is in; error messages name it ("at step 7"). Starts at -1,
 * which messages leave out. */
void dmrt_rank_set_step(dmrt_rank *r, int64_t step);
int64_t dmrt_rank_step(const dmrt_rank *r);

/* How long a collective may wait for the other ranks before it fails, in seconds
 * (> 0; anything else is ignored). The launcher sets it from $DMRT_COMM_TIMEOUT or, when
 * that is unset, to 120 s. Each rank has its own. */
void dmrt_rank_set_timeout(dmrt_rank *r, double seconds);
double dmrt_rank_timeout(const dmrt_rank *r);

/* The message of the last failed call on r ("" when none failed yet). */
const char *dmrt_rank_error(const dmrt_rank *r);

/* Declares r failed, with a message saying why (NULL: "aborted"). Every other rank's
 * pending or later collective and recv then fails promptly with "rank R failed:
 * <message>", and every later communicator call of r fails at once. Call it when a rank
 * cannot go on (a NaN loss, a file that does not load); the launchers call it for a
 * rank_main that returns non-zero. Only the first call has an effect. */
void dmrt_rank_abort(dmrt_rank *r, const char *message);

/* The communicator of all ranks; its rank is the world rank, its axis name "world". */
dmrt_comm *dmrt_rank_world(dmrt_rank *r);

/* ---- the mesh ------------------------------------------------------------------------ */

/* Places the ranks on a mesh of n_axes named axes (0 <= n_axes <= DMRT_MESH_MAX_AXES)
 * with the given sizes, row-major: the last axis varies fastest over world ranks, so on
 * data=2 x tensor=2 rank 1 is (data 0, tensor 1) and rank 2 is (data 1, tensor 0). The
 * product of the sizes must be the world size, else it fails with e.g. "mesh data=2 x
 * tensor=2 needs 4 ranks, the run has 3" (an empty mesh needs 1 rank). Names must be
 * non-empty, distinct, shorter than DMRT_MESH_NAME_MAX, and not "world".
 *
 * Every rank must call it, with the same mesh (it is a collective over the world, with
 * the deadline). A second call replaces the mesh; communicators of the old one are
 * freed. Returns 0, or DMRT_ERR_COMM with the message in err (may be NULL) and in
 * dmrt_rank_error. */
int dmrt_mesh_init(dmrt_rank *r, int n_axes, const char *const *axis_names,
                   const int64_t *axis_sizes, char *err, size_t errlen);

/* The same with `outside` more ranks than the mesh's product: world ranks from the
 * product on are on no axis (dmrt_mesh_inside 0, dmrt_mesh_axes 0) and reach the others
 * through the world (the parameter servers of dmrt_ps.h). Every rank calls it, outside
 * ones included, with the same arguments. */
int dmrt_mesh_init_outside(dmrt_rank *r, int n_axes, const char *const *axis_names,
                           const int64_t *axis_sizes, int outside, char *err, size_t errlen);
/* 1 for a rank on the mesh (every rank but those dmrt_mesh_init_outside left out). */
int dmrt_mesh_inside(const dmrt_rank *r);

/* Number of axes of the current mesh (0 before dmrt_mesh_init). */
int dmrt_mesh_axes(const dmrt_rank *r);
/* Index of the axis with that name, or -1. */
int dmrt_mesh_find_axis(const dmrt_rank *r, const char *name);
/* The communicator of the ranks that differ from r only along `axis`, ordered by their
 * coordinate on it: its rank is r's coordinate. NULL for an axis out of range. */
dmrt_comm *dmrt_mesh_axis(dmrt_rank *r, int axis);
/* r's coordinate along axis (-1 for an axis out of range). */
int dmrt_mesh_coord(const dmrt_rank *r, int axis);

/* ---- communicators ------------------------------------------------------------------- */

/* Number of ranks in c. */
int dmrt_comm_size(const dmrt_comm *c);
/* This rank's index in c, 0 .. size - 1 (its coordinate on c's axis). */
int dmrt_comm_rank(const dmrt_comm *c);
/* World rank of c's member i (0 <= i < size), or -1. */
int dmrt_comm_member(const dmrt_comm *c, int i);
/* "world" or the mesh axis name. */
const char *dmrt_comm_axis_name(const dmrt_comm *c);
/* The rank that owns c. */
dmrt_rank *dmrt_comm_owner(const dmrt_comm *c);

/* ---- collectives ----------------------------------------------------------------------
 *
 * All are called by every rank of c, in the same order, with the same sizes (and root);
 * the threads backend checks this and fails naming both calls. `what` labels the call in
 * messages, e.g. "allreduce of fc1.weight.grad (mlp.dm:21)"; NULL gives the op name.
 * Counts are in floats and may be 0. Buffers may be NULL only when they hold 0 floats.
 * All return 0, or DMRT_ERR_COMM with a message in dmrt_rank_error that names this rank,
 * the axis, the label and the step (a NULL communicator: DMRT_ERR_COMM, no message).
 * After a failure, buffers passed to the failed call must stay allocated until the
 * launcher returns (the MPI backend cannot cancel a collective it gave up on). */

/* buf[i] = sum over comm ranks k, in order, of rank k's buf[i], on every rank. In place. */
int dmrt_allreduce_sum(dmrt_comm *c, float *buf, int64_t n, const char *what);

/* recv (size * n_per_rank) = the send buffers (n_per_rank each) of comm ranks 0, 1, ...
 * concatenated. send may be recv + rank * n_per_rank (in place); no other overlap. */
int dmrt_allgather(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                   const char *what);

/* send holds size blocks of n_per_rank; comm rank i gets in recv (n_per_rank) the sum,
 * in comm-rank order, of block i of every rank's send. send and recv must not overlap. */
int dmrt_reduce_scatter_sum(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                            const char *what);

/* send and recv hold size blocks of n_per_rank; block j of rank i's send becomes block i
 * of rank j's recv. send and recv must not overlap. */
int dmrt_alltoall(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                  const char *what);

/* Every rank's buf (n floats) becomes comm rank root's buf. */
int dmrt_broadcast(dmrt_comm *c, int root, float *buf, int64_t n, const char *what);

/* Returns once every rank of c has called it. */
int dmrt_barrier(dmrt_comm *c, const char *what);

/* ---- overlapping a reduction with computation ------------------------------------------
 *
 * dmrt_allreduce_start begins dmrt_allreduce_sum(c, buf, n, what) and, where the backend
 * allows, returns at once: threads runs it on a helper thread of this rank (one per
 * communicator), so the caller computes meanwhile; MPI (initialised
 * MPI_THREAD_FUNNELED) runs it before returning. Until dmrt_comm_wait(c) returns, buf
 * must be neither read nor written and `what` must stay valid. Calls started on c run in
 * the order started; any other call on c first waits for them, so every rank still sees
 * the same sequence of calls. dmrt_comm_wait returns once every started call on c is
 * done: 0, or DMRT_ERR_COMM for the first that failed (message in dmrt_rank_error).
 * dmrt_allreduce_start itself returns DMRT_ERR_COMM only for a call that ran at once
 * and failed (wait reports it too). dmrt_allgather_start is the same for dmrt_allgather
 * (ZeRO 3 gathers the next layer's parameters while this one computes): until the wait,
 * send must not be written nor recv read or written. */
int dmrt_allreduce_start(dmrt_comm *c, float *buf, int64_t n, const char *what);
int dmrt_allgather_start(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                         const char *what);
int dmrt_comm_wait(dmrt_comm *c);

/* ---- compressed gradient reductions (compress.c, powersgd.c) ---------------------------
 *
 * Data parallelism's gradient allreduce with fewer bytes on the wire (docs/comm.md,
 * docs/parallelism.md "Gradient compression"). Each is built on the collectives above, so
 * every backend runs it; like them it is called by every rank of c in the same order with
 * the same sizes, and its result is identical on every rank (sums in comm-rank order).
 * `work` is the caller's scratch of work_elems floats, at least what the matching _work
 * function gives (else the call fails saying so); it must not overlap the other buffers. 0, or DMRT_ERR_COMM with the message in dmrt_rank_error. */

typedef enum dmrt_half_format { DMRT_BF16 = 1, DMRT_FP16 = 2 } dmrt_half_format;

/* The 16-bit value nearest x (ties to even; NaN stays NaN; beyond the format's range,
 * infinity; fp16 has subnormals down to 2^-24 and flushes below 2^-25 to zero), and a
 * 16-bit value as a float (exact). */
uint16_t dmrt_half_from_float(float x, dmrt_half_format format);
float dmrt_half_to_float(uint16_t h, dmrt_half_format format);

/* buf[i] = the sum over comm ranks of their buf[i] with 16 bits on the wire: each rank's
 * value rounded to the format, the ranks' values added in float in comm-rank order, the
 * sum rounded to the format once and widened back. An all-to-all of 16-bit slices (rank i
 * gets slice i of every buffer and sums it), then an all-gather of the 16-bit sums: half
 * the bytes of dmrt_allreduce_sum. work: dmrt_allreduce_half_work(n, size of c) floats. */
int64_t dmrt_allreduce_half_work(int64_t n, int ranks);
int dmrt_allreduce_sum_half(dmrt_comm *c, float *buf, int64_t n, dmrt_half_format format, float *work,
                            int64_t work_elems, const char *what);

/* dmrt_reduce_scatter_sum with 16 bits on the wire (ZeRO's reduction under --compress
 * bf16|fp16): rank i's recv (n_per_rank) = block i of every rank's send, each value rounded
 * to the format, added in float in comm-rank order, the sum rounded once and widened back:
 * element for element what dmrt_allreduce_sum_half makes. An all-to-all of 16-bit blocks.
 * work: dmrt_reduce_scatter_half_work(n_per_rank, size of c) floats, not overlapping send
 * or recv. */
int64_t dmrt_reduce_scatter_half_work(int64_t n_per_rank, int ranks);
int dmrt_reduce_scatter_sum_half(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                                 dmrt_half_format format, float *work, int64_t work_elems, const char *what);

/* A tensor in a range of gradients: top-k keeps k of its count elements per rank. */
typedef struct dmrt_topk_segment {
    int64_t offset;  /* where it starts in the range */
    int64_t count;   /* its elements */
    int64_t k;       /* how many of them each rank sends: 1 <= k <= count (0 when count is 0) */
} dmrt_topk_segment;

/* Top-k sparsification with error feedback over grads[0..n) (this rank's gradients, the
 * range's gaps zero) and residual[0..n) (what this rank has not sent yet, laid out alike;
 * zeros at the start). Per segment, residual += grads (an element of residual that is not
 * finite is replaced by the gradient's: a defence, docs/comm.md); the k elements of it
 * largest in magnitude (ties to the lower index; a NaN counts as the largest) are this
 * rank's piece, values and indices, and become zero in residual. The pieces are
 * all-gathered (8 bytes per element kept, per rank), and grads becomes their sum: zeros,
 * to which each rank's values are added at their indices in comm-rank order. With k = count everywhere it is
 * dmrt_allreduce_sum of grads (0 + x0 + x1 ...). n < 2^31. work:
 * dmrt_allreduce_topk_work(segs, n_segs, size of c) floats. */
int64_t dmrt_allreduce_topk_work(const dmrt_topk_segment *segs, int n_segs, int ranks);
int dmrt_allreduce_topk(dmrt_comm *c, float *grads, float *residual, int64_t n, const dmrt_topk_segment *segs,
                        int n_segs, float *work, int64_t work_elems, const char *what);

/* A tensor in a range of gradients, as a rows x cols matrix (row-major; a vector is 1 x n). */
typedef struct dmrt_powersgd_segment {
    int64_t offset;     /* where it starts in the range */
    int64_t rows, cols;
    int compressed;     /* 1: reduced through rank-r factors; 0: summed exactly (vectors, and
                         * matrices whose factors would be no smaller) */
    uint64_t stream;    /* its factor's random stream (the parameter's number) */
} dmrt_powersgd_segment;

/* PowerSGD with error feedback over grads[0..n) and residual[0..n) (as for top-k), and
 * q, the compressed segments' Q factors (cols x rank each, row-major) one after another.
 * Per compressed segment: M = residual + grads (kept in residual; as for top-k, an element
 * of residual not finite is replaced by the gradient's); P = M Q; every P and the exact
 * segments' gradients are summed over ranks in one dmrt_allreduce_sum; each P is
 * orthonormalised (Gram-Schmidt on its columns in order, dot products and norms in double,
 * a zero column left zero); Q = M^T P; residual = M - P Q^T with this rank's Q; every Q is
 * summed in a second allreduce, and grads = P Q^T with the sum, which stays in q to start
 * the next step (one with a zero column or an element not finite is drawn again, alike on
 * every rank since the sum is: dmrt_powersgd_random with the segment's stream +
 * (step << 32)). Bytes on the wire: (rows + cols) x rank floats per compressed segment.
 * work: dmrt_allreduce_powersgd_work floats (every P and exact
 * segment). dmrt_powersgd_init fills q from the seed (every rank the same values). */
int64_t dmrt_allreduce_powersgd_work(const dmrt_powersgd_segment *segs, int n_segs, int rank);
int dmrt_allreduce_powersgd(dmrt_comm *c, float *grads, float *residual, float *q, int64_t n,
                            const dmrt_powersgd_segment *segs, int n_segs, int rank, uint64_t seed, int64_t step,
                            float *work, int64_t work_elems, const char *what);
void dmrt_powersgd_init(float *q, const dmrt_powersgd_segment *segs, int n_segs, int rank, uint64_t seed);
/* q[0..n) uniform in [-1, 1) (multiples of 2^-23) from seed and stream: element i is
 * splitmix64's output of key + i + 1 steps, key being its output of seed + stream + 1
 * steps; the top 24 bits, less 2^23, over 2^23. */
void dmrt_powersgd_random(float *q, int64_t n, uint64_t seed, uint64_t stream);

/* ---- point to point (pipeline stages) --------------------------------------------------
 *
 * peer is a rank of c. Messages between a pair arrive in the order sent, and a recv must
 * ask for exactly the count that was sent (else it fails naming both). Sends are
 * buffered: dmrt_send copies buf and returns without waiting for the receiver, so both
 * sides of a pair may send first, at any size (each pending message holds a copy until
 * it is received). dmrt_recv waits, with the deadline, for the next message from peer.
 * Sending to oneself is allowed. */
int dmrt_send(dmrt_comm *c, int peer, const float *buf, int64_t n, const char *what);
int dmrt_recv(dmrt_comm *c, int peer, float *buf, int64_t n, const char *what);
/* The same on channel tag (0 to DMRT_MAX_TAG; dmrt_send and dmrt_recv use 0): the order
 * is kept per pair and channel, and a recv takes the next message from peer on its
 * channel, whatever came before on others. Pipelines whose ranks hold several model
 * chunks send on a channel per pair of stages: a pair of ranks carries several streams,
 * which each side runs in its own order. */
#define DMRT_MAX_TAG 16383
int dmrt_send_tagged(dmrt_comm *c, int peer, int tag, const float *buf, int64_t n, const char *what);
int dmrt_recv_tagged(dmrt_comm *c, int peer, int tag, float *buf, int64_t n, const char *what);

/* 1 when a message from peer on channel tag is waiting (the next dmrt_recv_tagged from
 * peer on tag takes it without waiting), 0 when none is, DMRT_ERR_COMM when a rank has
 * failed. Never waits: a rank serving several peers polls them in turn. */
int dmrt_probe_tagged(dmrt_comm *c, int peer, int tag, const char *what);

/* ---- launchers ------------------------------------------------------------------------ */

/* ---- timeline ------------------------------------------------------------------------
 *
 * Generated pipeline code records each forward and backward action of a micro-batch
 * (docs/trainer.md, --trace). Off until dmrt_trace_enable; then every action costs two
 * clock reads. */
typedef struct dmrt_trace_event {
    char kind;          /* 'F' or 'B' */
    int chunk;          /* the rank's model chunk (interleaved schedule), else 0 */
    int64_t micro;      /* micro-batch */
    int64_t step;       /* dmrt_rank_step when it ran */
    double start, end;  /* seconds, CLOCK_MONOTONIC */
} dmrt_trace_event;

/* Starts recording r's actions (at most 1 << 20; later ones are dropped). 0, or
 * DMRT_ERR_COMM when out of memory. */
int dmrt_trace_enable(dmrt_rank *r);
/* The clock, when r records; 0 otherwise. */
double dmrt_trace_now(const dmrt_rank *r);
/* Records an action of r that began at start and ends now (nothing when off). */
void dmrt_trace_action(dmrt_rank *r, char kind, int64_t micro, double start);
/* The same for an action on model chunk `chunk` of r's pipeline stage. */
void dmrt_trace_chunk_action(dmrt_rank *r, char kind, int64_t micro, int chunk, double start);
/* r's recorded actions, in order. */
int64_t dmrt_trace_events(const dmrt_rank *r, const dmrt_trace_event **events);
/* Every rank's actions, on world rank 0 (a collective over the world: every rank calls
 * it): *all (malloc'd, the caller frees) holds counts[r] events of world rank r in turn;
 * other ranks get NULL. Returns 0, or DMRT_ERR_COMM / DMRT_ERR_NOMEM. */
int dmrt_trace_gather(dmrt_rank *r, dmrt_trace_event **all, int64_t *counts);

/* What a rank runs: return 0 on success, non-zero (with dmrt_rank_error or an abort
 * message saying why) on failure. */
typedef int (*dmrt_rank_main)(dmrt_rank *r, void *arg);

/* Runs rank_main on n_ranks threads of this process (one dmrt_rank each, world ranks
 * 0 .. n_ranks - 1, an empty mesh) and joins them. A rank_main that returns non-zero
 * aborts the others (dmrt_rank_abort with its status and message). Returns 0 when every
 * rank returned 0; else the status of the rank that failed first, with err naming it and
 * its message and listing the ranks that failed after it. Reads $DMRT_COMM_TIMEOUT.
 * Several runs may go on at once in one process; each has its own ranks. */
int dmrt_threads_run(int n_ranks, dmrt_rank_main rank_main, void *arg, char *err,
                     size_t errlen);

/* Runs rank_main once in this MPI process: MPI_Init_thread (MPI_THREAD_FUNNELED: call
 * the communicators from this thread), rank_main, then an agreement of all ranks on
 * their statuses, MPI_Finalize. A rank_main that returns non-zero aborts the others, as
 * with threads. Returns 0 when every rank returned 0; else, on every rank, the status of
 * the first failed rank (the lowest that failed on its own rather than after another's
 * abort), with err naming it and its message and listing the others that failed. A rank
 * that cannot complete the agreement within the launch-time deadline (a rank is stuck or
 * gone) prints why and calls MPI_Abort, the last resort. Once per process. Defined in
 * dmrt_comm_mpi only. */
int dmrt_mpi_run(int *argc, char ***argv, dmrt_rank_main rank_main, void *arg, char *err,
                 size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
