/* comm_internal.h: what the backends of dmrt_comm share; not installed.
 *
 * comm.c holds everything that does not depend on the backend: the rank and the mesh,
 * argument checks, error messages. A backend fills a dmrt_comm_backend table; comm.c
 * calls it once the arguments are known to be good.
 *
 * The functions declared here cross files, so the static library exports them: they
 * carry the dmrt_comm_ prefix like the public ones (a program with its own comm_now must
 * still link; tests/tools/check_symbols.py holds every library to it). */
#ifndef DMRT_COMM_INTERNAL_H
#define DMRT_COMM_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>

#include "dmrt_comm.h"

#if defined(__GNUC__) || defined(__clang__)
#define COMM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define COMM_PRINTF(f, a)
#endif

#define COMM_ERROR_MAX 1024

/* The collectives, as the backends and the mismatch checks name them. */
typedef enum {
    COMM_OP_ALLREDUCE,
    COMM_OP_ALLGATHER,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_ALLTOALL,
    COMM_OP_BROADCAST,
    COMM_OP_BARRIER,
    COMM_OP_SEND,
    COMM_OP_RECV,
    COMM_OP_PROBE,
    COMM_OP_COUNT
} comm_op;

/* "allreduce", "allgather", ... */
const char *dmrt_comm_op_name(comm_op op);

/* One call in progress: what messages say about it. */
typedef struct comm_call {
    comm_op op;
    const char *what;  /* the caller's label, or the op name */
    double deadline;   /* dmrt_comm_now() by which it must be done */
    int tag;           /* send and recv: the channel (dmrt_send_tagged), 0 for the rest */
} comm_call;

typedef struct comm_async comm_async;

struct dmrt_comm {
    dmrt_rank *rank;                      /* owner */
    comm_async *async;                    /* started allreduces (dmrt_allreduce_start), or NULL */
    int started_status;                   /* first failure of a start the backend ran at once */
    int size;
    int me;                               /* this rank's index in the comm */
    int *members;                         /* (size) world rank of each comm rank */
    char axis_name[DMRT_MESH_NAME_MAX];   /* "world" or the mesh axis */
    void *impl;                           /* the backend's state for this comm */
};

typedef struct dmrt_comm_backend dmrt_comm_backend;

struct dmrt_rank {
    int id, count;                        /* world rank, world size */
    int64_t step;                         /* -1: no step yet */
    double timeout;                       /* seconds a call may wait */
    _Atomic int failed;                   /* this rank aborted: every call fails at once (set
                                           * after abort_message is written) */
    _Atomic int abort_claimed;            /* the thread that aborts r claims it first */
    char error[COMM_ERROR_MAX];           /* last error message */
    char abort_message[COMM_ERROR_MAX];   /* why this rank aborted (when failed) */
    const dmrt_comm_backend *backend;
    void *impl;                           /* the backend's state for this rank */
    uint64_t comms_created;               /* counts comm creations; identifies groups */
    dmrt_comm world;
    int n_axes;
    int outside;                          /* not on the mesh: world rank >= its product */
    char axis_names[DMRT_MESH_MAX_AXES][DMRT_MESH_NAME_MAX];
    int axis_sizes[DMRT_MESH_MAX_AXES];
    int coords[DMRT_MESH_MAX_AXES];
    dmrt_comm *axes[DMRT_MESH_MAX_AXES];
    struct comm_trace *trace;             /* pipeline actions recorded (trace.c), or NULL: off */
};

/* trace.c: frees r's trace. */
void dmrt_comm_trace_free(dmrt_rank *r);

/* A backend. Collectives get checked arguments (c non-NULL, counts >= 0 and within
 * int64 when multiplied by the size, buffers non-NULL when they hold data, root/peer in
 * range, the rank not failed) and return 0 or DMRT_ERR_COMM after dmrt_comm_fail(). */
struct dmrt_comm_backend {
    const char *name;
    /* Whether a rank may call collectives on two of its communicators from two threads
     * at once: dmrt_allreduce_start then hands its call to a helper thread. */
    int concurrent_comms;
    /* Sets up c->impl for a comm whose size, me, members and axis_name are filled in;
     * every member calls it, with the same seq (the owner's comms_created count). */
    int (*comm_create)(dmrt_comm *c, uint64_t seq, const comm_call *call);
    void (*comm_destroy)(dmrt_comm *c);
    int (*allreduce_sum)(dmrt_comm *c, float *buf, int64_t n, const comm_call *call);
    int (*allgather)(dmrt_comm *c, const float *send, float *recv, int64_t n,
                     const comm_call *call);
    int (*reduce_scatter_sum)(dmrt_comm *c, const float *send, float *recv, int64_t n,
                              const comm_call *call);
    int (*alltoall)(dmrt_comm *c, const float *send, float *recv, int64_t n,
                    const comm_call *call);
    int (*broadcast)(dmrt_comm *c, int root, float *buf, int64_t n, const comm_call *call);
    int (*barrier)(dmrt_comm *c, const comm_call *call);
    int (*send)(dmrt_comm *c, int peer, const float *buf, int64_t n, const comm_call *call);
    int (*recv)(dmrt_comm *c, int peer, float *buf, int64_t n, const comm_call *call);
    /* 1 when a message from peer on call->tag is waiting, else 0 (without waiting). */
    int (*probe)(dmrt_comm *c, int peer, const comm_call *call);
    /* What a rank outside the mesh does while the mesh's ranks run comm_create for an
     * axis (MPI_Comm_split is a collective over the world); NULL: nothing. */
    int (*comm_skip)(dmrt_rank *r, const comm_call *call);
    /* Tells the other ranks that r failed with this message (r->failed is already set). */
    void (*abort)(dmrt_rank *r, const char *message);
};

/* dmrt_allreduce_sum without waiting for the calls started on c (async.c's helper). */
int dmrt_comm_allreduce_now(dmrt_comm *c, float *buf, int64_t n, const char *what);
int dmrt_comm_allgather_now(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                       const char *what);
/* Waits until every allreduce started on c is done (before a blocking call on c). */
void dmrt_comm_settle(dmrt_comm *c);
/* dmrt_comm_settle, then stops c's helper thread (before c is destroyed). */
void dmrt_comm_async_stop(dmrt_comm *c);
/* Stops the helper threads of every comm of r (once its main function returned: no
 * started call may outlive the buffers it reduces). */
void dmrt_comm_rank_stop_helpers(dmrt_rank *r);
/* Makes this thread's communicator errors go to buf (COMM_ERROR_MAX bytes) instead of
 * its rank's error: a helper thread writes its own, and the rank's thread copies it over
 * when it waits (two threads never write one rank's error). NULL: back to the rank's. */
void dmrt_comm_set_error_sink(char *buf);
/* Where this thread's errors go for r: the sink, or r->error. */
char *dmrt_comm_error_buffer(dmrt_rank *r);
/* Claims the abort of r for this thread: 1 for the first caller, 0 after. The claimer
 * writes abort_message, then sets failed. */
int dmrt_comm_claim_abort(dmrt_rank *r);

/* Monotonic seconds. */
double dmrt_comm_now(void);

/* Fills a new rank (world comm included, no mesh) for a backend; timeout from
 * $DMRT_COMM_TIMEOUT or 120 s. The world comm's impl is left for the backend. Returns 0,
 * or -1 with a message in err when $DMRT_COMM_TIMEOUT is not a positive number. */
int dmrt_comm_rank_init(dmrt_rank *r, int id, int count, const dmrt_comm_backend *backend,
                   char *err, size_t errlen);
/* Waits for the started allreduces of every comm of r and stops their helper threads;
 * frees the mesh comms (through the backend) and the world's member list; not the
 * world's impl, which the backend frees. */
void dmrt_comm_rank_release(dmrt_rank *r);

/* Writes "rank R: <what> on axis A at step S: <detail>" into the owner's error and
 * returns DMRT_ERR_COMM. */
int dmrt_comm_fail(dmrt_comm *c, const comm_call *call, const char *fmt, ...) COMM_PRINTF(3, 4);
/* Same, from a va_list. */
int dmrt_comm_vfail(dmrt_comm *c, const comm_call *call, const char *fmt, va_list ap);

/* A compressed reduction's own failure (compress.c): "rank R: <what> on axis A at step S:
 * <detail>" in the owner's error; returns DMRT_ERR_COMM. */
int dmrt_comm_compress_fail(dmrt_comm *c, const char *what, const char *fmt, ...) COMM_PRINTF(3, 4);
/* Fails the call (as above) unless work holds at least need floats (work_elems). */
int dmrt_comm_check_work(dmrt_comm *c, const char *what, const float *work, int64_t work_elems, int64_t need);

/* Error feedback's accumulation (top-k, PowerSGD): acc[0..n) += grad[0..n), except that an
 * element of acc not finite starts again from the gradient's. A defence: the generated
 * code keeps fp16's non-finite steps away from the residual, but one that got there
 * would otherwise stay for good. */
void dmrt_comm_feedback_add(float *acc, const float *grad, int64_t n);

/* snprintf into buf, truncating quietly: messages are cut at the buffer size on purpose
 * (a direct snprintf would draw -Wformat-truncation). */
void dmrt_comm_format(char *buf, size_t size, const char *fmt, ...) COMM_PRINTF(3, 4);

/* snprintf that appends to buf (holding strlen(buf) bytes already) and never overflows. */
void dmrt_comm_appendf(char *buf, size_t size, const char *fmt, ...) COMM_PRINTF(3, 4);

/* The error message of r without its leading "rank R: ", as sent to the other ranks. */
const char *dmrt_comm_error_body(const dmrt_rank *r);

/* Splits [0, n) into `parts` slices on 16-float (64-byte) boundaries, so that no two
 * ranks write the same cache line: slice i is [*lo, *hi). Both backends use it. */
void dmrt_comm_slice(int64_t n, int parts, int i, int64_t *lo, int64_t *hi);

/* dst[0..n) = sum over k = 0 .. count-1, in this order, of srcs[k][0..n): the one
 * reduction both backends use, so that their results agree bit for bit. dst may be one
 * of the sources (each element is read from every source before it is written). */
void dmrt_comm_sum_ordered(float *dst, const float *const *srcs, int count, int64_t n);

#endif
