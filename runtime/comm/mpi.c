/* mpi.c: the MPI backend of dmrt_comm, and dmrt_mpi_run.
 *
 * One rank per MPI process. Each dmrt_comm owns an MPI communicator (the world's is a
 * dup of MPI_COMM_WORLD, a mesh axis's comes from MPI_Comm_split). Every collective is
 * non-blocking (MPI_Iallgather, MPI_Ialltoall(v), MPI_Ibcast, MPI_Ibarrier, Isend,
 * Imrecv) and polled with MPI_Test, so that a wait can end at the deadline or on an abort
 * notice instead of hanging inside MPI.
 *
 * Sums are not left to MPI_Allreduce, whose order of additions is the library's choice:
 * allreduce is an alltoallv of slices (each rank gets slice i of every buffer), a local
 * sum in comm-rank order (dmrt_comm_sum_ordered, as in the threads backend), and an in-place
 * allgatherv; small buffers use one allgather and every rank sums all of them.
 * reduce-scatter is an alltoall and the same ordered sum. Results are therefore bit for
 * bit those of the threads backend and of the serial sum.
 *
 * Failure. A second communicator, `control` (a dup of the world), carries abort notices:
 * dmrt_rank_abort sends its message to every other rank (MPI_Isend, tag TAG_ABORT), and
 * every wait probes for notices. A rank that sees one stops waiting (after a short grace,
 * in case the operation it is in completes) and fails with "rank R failed: <message>";
 * later calls fail at once. A wait past the deadline fails, then aborts like
 * dmrt_rank_abort. An operation given up on cannot be cancelled in MPI: its request and
 * memory are left alone until MPI_Finalize.
 *
 * dmrt_mpi_run ends with an agreement: an MPI_Iallgather of (status, failed on its own)
 * over `control`, polled with the deadline. Every rank then knows who failed first and
 * returns the same status and message. A rank that cannot complete the agreement (a rank
 * is stuck or gone) prints why and calls MPI_Abort, the last resort.
 *
 * Every MPI call goes through MPI_CHECK, MPI_OK or MPI_WARN, which name the call and its
 * file:line. */
#include "comm_internal.h"

#include <mpi.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TAG_P2P 1   /* channel t of dmrt_send_tagged is tag TAG_P2P + t: at most 16384, below the
                     * 32767 every MPI allows */
#define TAG_ABORT 2
/* Floats per MPI call (counts and displacements are int): larger buffers go in pieces. */
#define MPI_CHUNK ((int64_t)1 << 28)
/* allreduce of up to this many floats: one allgather and a full local sum. */
#define SMALL_ALLREDUCE 2048
/* After an abort notice, how long a pending operation may still complete. */
#define ABORT_GRACE_S 0.25

typedef struct mpi_rank_state {
    MPI_Comm control;           /* dup of the world: abort notices and the agreement */
    int failed_rank;            /* -1, or the rank whose abort notice came first */
    int originated;             /* this rank failed on its own, not after a notice */
    char **notices;             /* (count) each rank's notice text, once received */
    char notice_text[COMM_ERROR_MAX];  /* what this rank sent; alive until MPI_Finalize */
    MPI_Request *notice_sends;  /* (count) */
    void **graveyard;           /* memory MPI may still use: freed after MPI_Finalize */
    int n_graveyard, graveyard_cap;
    double end_timeout;         /* deadline of the final agreement: the launch-time one,
                                 * not what rank_main set for its collectives */
} mpi_rank_state;

typedef struct pending_send {
    MPI_Request req;            /* MPI_REQUEST_NULL once complete: data can be reused */
    float *data;
    int64_t capacity;
} pending_send;

typedef struct mpi_comm_state {
    MPI_Comm comm;
    int abandoned;              /* a request was given up on: keep comm and memory */
    float *work;                /* (work_cap) receive space of allreduce, reduce-scatter */
    int64_t work_cap;
    int *counts;                /* (4 * size) counts and displacements of v-collectives */
    const float **srcs;         /* (size) */
    pending_send *sends;
    int n_sends, sends_cap;
} mpi_comm_state;

/* ---- checking MPI calls -------------------------------------------------------------- */

/* "MPI_Test failed at mpi.c:123: <MPI's message>" into buf; returns rc != MPI_SUCCESS. */
static int mpi_report(int rc, const char *expr, const char *file, int line, char *buf,
                      size_t size) {
    if (rc == MPI_SUCCESS) return 0;
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        dmrt_comm_format(text, sizeof text, "code %d", rc);
    int name_len = (int)strcspn(expr, "(");  /* "MPI_Test(&req, ...)" -> "MPI_Test" */
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (buf && size)
        dmrt_comm_format(buf, size, "%.*s failed at %s:%d: %s", name_len, expr, base, line, text);
    else
        fprintf(stderr, "dmrt_comm: %.*s failed at %s:%d: %s\n", name_len, expr, base, line,
                text);
    return 1;
}

/* For calls made on behalf of a collective: fails it (and aborts the run). */
#define MPI_CHECK(c, call, expr)                                                           \
    do {                                                                                   \
        char mpi_msg_[COMM_ERROR_MAX];                                                     \
        if (mpi_report((expr), #expr, __FILE__, __LINE__, mpi_msg_, sizeof mpi_msg_))      \
            return mpi_failed((c), (call), mpi_msg_);                                       \
    } while (0)

/* For other calls: true when the call succeeded; else the message is in buf (or, with
 * buf NULL, on stderr). */
#define MPI_OK(expr, buf, size) (mpi_report((expr), #expr, __FILE__, __LINE__, (buf), (size)) == 0)
/* For calls whose failure can only be reported: on stderr. */
#define MPI_WARN(expr) ((void)mpi_report((expr), #expr, __FILE__, __LINE__, NULL, 0))

static void mpi_abort_notice(dmrt_rank *r, const char *message);

static int mpi_failed(dmrt_comm *c, const comm_call *call, const char *msg) {
    dmrt_comm_fail(c, call, "%s", msg);
    if (dmrt_comm_claim_abort(c->rank)) {
        dmrt_comm_format(c->rank->abort_message, sizeof c->rank->abort_message, "%s",
                    dmrt_comm_error_body(c->rank));
        c->rank->failed = 1;
        mpi_abort_notice(c->rank, c->rank->abort_message);
    }
    return DMRT_ERR_COMM;
}

/* ---- memory that MPI may still touch ---------------------------------------------------- */

static void bury(mpi_rank_state *rs, void *p) {
    if (!p) return;
    if (rs->n_graveyard == rs->graveyard_cap) {
        int cap = rs->graveyard_cap ? 2 * rs->graveyard_cap : 16;
        void **grown = realloc(rs->graveyard, sizeof *grown * (size_t)cap);
        if (!grown) return;  /* leak it: freeing memory MPI may use would be worse */
        rs->graveyard = grown;
        rs->graveyard_cap = cap;
    }
    rs->graveyard[rs->n_graveyard++] = p;
}

/* ---- abort notices ------------------------------------------------------------------------ */

static void mpi_abort_notice(dmrt_rank *r, const char *message) {
    mpi_rank_state *rs = r->impl;
    rs->originated = rs->failed_rank < 0;
    dmrt_comm_format(rs->notice_text, sizeof rs->notice_text, "%s", message);
    int len = (int)strlen(rs->notice_text) + 1;
    for (int i = 0; i < r->count; i++) {
        if (i == r->id || rs->notice_sends[i] != MPI_REQUEST_NULL) continue;
        MPI_WARN(MPI_Isend(rs->notice_text, len, MPI_CHAR, i, TAG_ABORT, rs->control,
                         &rs->notice_sends[i]));
    }
}

/* Receives the abort notices that have arrived. Returns 0, or 1 with msg set when MPI
 * fails. Open MPI's MPI_Improbe looks at the queue of arrived messages and only then
 * progresses (pulling in what is waiting in shared memory), so one empty probe is not
 * proof: an empty probe is repeated once. */
static int receive_notices(dmrt_rank *r, char *msg, size_t size) {
    mpi_rank_state *rs = r->impl;
    for (int empty = 0; empty < 2;) {
        int found = 0;
        MPI_Message m;
        MPI_Status st;
        if (!MPI_OK(MPI_Improbe(MPI_ANY_SOURCE, TAG_ABORT, rs->control, &found, &m, &st), msg,
                    size))
            return 1;
        if (!found) {
            empty++;
            continue;
        }
        int len = 0;
        if (!MPI_OK(MPI_Get_count(&st, MPI_CHAR, &len), msg, size)) return 1;
        char *text = malloc((size_t)len + 1);
        char scratch[1];
        if (!MPI_OK(MPI_Mrecv(text ? text : scratch, text ? len : 0, MPI_CHAR, &m,
                              MPI_STATUS_IGNORE), msg, size)) {
            free(text);
            return 1;
        }
        int src = st.MPI_SOURCE;
        if (text) text[len] = 0;
        if (text && src >= 0 && src < r->count && !rs->notices[src]) {
            rs->notices[src] = text;
        } else {
            free(text);
        }
        if (rs->failed_rank < 0) rs->failed_rank = src;
    }
    return 0;
}

static const char *notice_of(const mpi_rank_state *rs, int rank) {
    return rs->notices[rank] ? rs->notices[rank] : "(no message)";
}

/* Fails the call if an abort notice has arrived. */
static int mpi_enter(dmrt_comm *c, const comm_call *call) {
    mpi_rank_state *rs = c->rank->impl;
    char msg[COMM_ERROR_MAX];
    if (receive_notices(c->rank, msg, sizeof msg)) return mpi_failed(c, call, msg);
    if (rs->failed_rank >= 0)
        return dmrt_comm_fail(c, call, "rank %d failed: %s", rs->failed_rank,
                         notice_of(rs, rs->failed_rank));
    return 0;
}

/* ---- waiting --------------------------------------------------------------------------------- */

/* Polling costs a core; past the first millisecond a waiter yields, and after a second
 * (a rank far behind) it sleeps between polls. */
static void back_off(double waited) {
    if (waited < 1e-3) return;
    if (waited < 1.0) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited < 10.0 ? 100000L : 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits for req (or, with req NULL, for a message from source/tag on comm: *message and
 * *status set). Returns 0 when it completed; else fails the call: on an abort notice
 * (after ABORT_GRACE_S), at the deadline (then aborts), on an MPI error. */
static int wait_for(dmrt_comm *c, const comm_call *call, MPI_Request *req, int source, int tag,
                    MPI_Message *message, MPI_Status *status) {
    mpi_rank_state *rs = c->rank->impl;
    mpi_comm_state *cs = c->impl;
    double start = dmrt_comm_now(), give_up = -1;
    for (long polls = 0;; polls++) {
        int done = 0;
        if (req)
            MPI_CHECK(c, call, MPI_Test(req, &done, MPI_STATUS_IGNORE));
        else
            MPI_CHECK(c, call, MPI_Improbe(source, tag, cs->comm, &done, message, status));
        if (done) return 0;
        double now = dmrt_comm_now();
        if ((polls & 15) == 0 && give_up < 0) {
            char msg[COMM_ERROR_MAX];
            if (receive_notices(c->rank, msg, sizeof msg)) return mpi_failed(c, call, msg);
            if (rs->failed_rank >= 0) give_up = now + ABORT_GRACE_S;
        }
        int notice = give_up >= 0 && now >= give_up;
        if (notice || now >= call->deadline) {
            if (req && *req != MPI_REQUEST_NULL) cs->abandoned = 1;
            if (notice)
                return dmrt_comm_fail(c, call, "rank %d failed: %s", rs->failed_rank,
                                 notice_of(rs, rs->failed_rank));
            const char *what = req ? "not every rank arrived (MPI cannot tell which)"
                                   : "nothing came from";
            if (req)
                dmrt_comm_fail(c, call, "timed out after %g s: %s", c->rank->timeout, what);
            else
                dmrt_comm_fail(c, call, "timed out after %g s: %s rank %d", c->rank->timeout, what,
                          c->members[source]);
            /* claimed as mpi_failed does: else the trainer's dmrt_rank_abort would claim it
             * again and rewrite the notice while its first sends may still read it */
            if (dmrt_comm_claim_abort(c->rank)) {
                c->rank->failed = 1;
                dmrt_comm_format(c->rank->abort_message, sizeof c->rank->abort_message, "%s",
                                 dmrt_comm_error_body(c->rank));
                mpi_abort_notice(c->rank, c->rank->abort_message);
            }
            return DMRT_ERR_COMM;
        }
        back_off(now - start);
    }
}

static int wait_request(dmrt_comm *c, const comm_call *call, MPI_Request *req) {
    return wait_for(c, call, req, 0, 0, NULL, NULL);
}

/* ---- collectives ------------------------------------------------------------------------ */

static int too_big(dmrt_comm *c, const comm_call *call, int64_t n) {
    if (n <= INT_MAX) return 0;
    return dmrt_comm_fail(c, call, "%lld floats per rank: the MPI backend moves at most %d per rank"
                     " in one %s", (long long)n, INT_MAX, dmrt_comm_op_name(call->op));
}

static int ensure_work(dmrt_comm *c, const comm_call *call, int64_t floats) {
    mpi_comm_state *cs = c->impl;
    if (cs->work_cap >= floats) return 0;
    float *grown = malloc((size_t)floats * sizeof(float));
    if (!grown) return dmrt_comm_fail(c, call, "out of memory for %lld floats of work space",
                                 (long long)floats);
    free(cs->work);
    cs->work = grown;
    cs->work_cap = floats;
    return 0;
}

/* allreduce of one piece (n <= MPI_CHUNK). */
static int allreduce_piece(dmrt_comm *c, float *buf, int n, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    int size = c->size;
    MPI_Request req;
    if (n <= SMALL_ALLREDUCE) {
        if (ensure_work(c, call, (int64_t)size * n)) return DMRT_ERR_COMM;
        MPI_CHECK(c, call, MPI_Iallgather(buf, n, MPI_FLOAT, cs->work, n, MPI_FLOAT, cs->comm,
                                          &req));
        if (wait_request(c, call, &req)) return DMRT_ERR_COMM;
        for (int k = 0; k < size; k++) cs->srcs[k] = cs->work + (int64_t)k * n;
        dmrt_comm_sum_ordered(buf, cs->srcs, size, n);
        return 0;
    }
    /* Slice k of every buffer goes to rank k, which sums them in rank order; then the
     * sums are gathered back in place. */
    int *slice_len = cs->counts, *slice_lo = cs->counts + size;
    int *recv_len = cs->counts + 2 * size, *recv_at = cs->counts + 3 * size;
    for (int k = 0; k < size; k++) {
        int64_t lo, hi;
        dmrt_comm_slice(n, size, k, &lo, &hi);
        slice_lo[k] = (int)lo;
        slice_len[k] = (int)(hi - lo);
    }
    int mine = slice_len[c->me];
    for (int k = 0; k < size; k++) {
        recv_len[k] = mine;
        recv_at[k] = k * mine;
    }
    if (ensure_work(c, call, (int64_t)size * mine)) return DMRT_ERR_COMM;
    MPI_CHECK(c, call, MPI_Ialltoallv(buf, slice_len, slice_lo, MPI_FLOAT, cs->work, recv_len,
                                      recv_at, MPI_FLOAT, cs->comm, &req));
    if (wait_request(c, call, &req)) return DMRT_ERR_COMM;
    for (int k = 0; k < size; k++) cs->srcs[k] = cs->work + (int64_t)k * mine;
    dmrt_comm_sum_ordered(buf + slice_lo[c->me], cs->srcs, size, mine);
    MPI_CHECK(c, call, MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, slice_len, slice_lo,
                                       MPI_FLOAT, cs->comm, &req));
    return wait_request(c, call, &req);
}

static int mpi_allreduce(dmrt_comm *c, float *buf, int64_t n, const comm_call *call) {
    if (mpi_enter(c, call)) return DMRT_ERR_COMM;
    if (c->size == 1) return 0;
    for (int64_t off = 0; off < n; off += MPI_CHUNK) {
        int64_t len = n - off < MPI_CHUNK ? n - off : MPI_CHUNK;
        if (allreduce_piece(c, buf + off, (int)len, call)) return DMRT_ERR_COMM;
    }
    return 0;
}

static int mpi_allgather(dmrt_comm *c, const float *send, float *recv, int64_t n,
                         const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call) || too_big(c, call, n)) return DMRT_ERR_COMM;
    if (n == 0) return 0;
    const void *src = send == recv + (int64_t)c->me * n ? MPI_IN_PLACE : (const void *)send;
    MPI_Request req;
    MPI_CHECK(c, call, MPI_Iallgather(src, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, cs->comm,
                                      &req));
    return wait_request(c, call, &req);
}

static int mpi_reduce_scatter(dmrt_comm *c, const float *send, float *recv, int64_t n,
                              const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call) || too_big(c, call, n)) return DMRT_ERR_COMM;
    if (n == 0) return 0;
    if (ensure_work(c, call, n * c->size)) return DMRT_ERR_COMM;
    MPI_Request req;
    MPI_CHECK(c, call, MPI_Ialltoall(send, (int)n, MPI_FLOAT, cs->work, (int)n, MPI_FLOAT,
                                     cs->comm, &req));
    if (wait_request(c, call, &req)) return DMRT_ERR_COMM;
    for (int k = 0; k < c->size; k++) cs->srcs[k] = cs->work + (int64_t)k * n;
    dmrt_comm_sum_ordered(recv, cs->srcs, c->size, n);
    return 0;
}

static int mpi_alltoall(dmrt_comm *c, const float *send, float *recv, int64_t n,
                        const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call) || too_big(c, call, n)) return DMRT_ERR_COMM;
    if (n == 0) return 0;
    MPI_Request req;
    MPI_CHECK(c, call, MPI_Ialltoall(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, cs->comm,
                                     &req));
    return wait_request(c, call, &req);
}

static int mpi_broadcast(dmrt_comm *c, int root, float *buf, int64_t n, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call)) return DMRT_ERR_COMM;
    for (int64_t off = 0; off < n; off += MPI_CHUNK) {
        int len = (int)(n - off < MPI_CHUNK ? n - off : MPI_CHUNK);
        MPI_Request req;
        MPI_CHECK(c, call, MPI_Ibcast(buf + off, len, MPI_FLOAT, root, cs->comm, &req));
        if (wait_request(c, call, &req)) return DMRT_ERR_COMM;
    }
    return 0;
}

static int mpi_barrier(dmrt_comm *c, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call)) return DMRT_ERR_COMM;
    MPI_Request req;
    MPI_CHECK(c, call, MPI_Ibarrier(cs->comm, &req));
    return wait_request(c, call, &req);
}

/* ---- point to point ---------------------------------------------------------------------- */

/* Completes what it can of the buffered sends, without waiting. */
static int progress_sends(dmrt_comm *c, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    for (int i = 0; i < cs->n_sends; i++) {
        int done;
        if (cs->sends[i].req == MPI_REQUEST_NULL) continue;
        MPI_CHECK(c, call, MPI_Test(&cs->sends[i].req, &done, MPI_STATUS_IGNORE));
    }
    return 0;
}

/* A completed send buffer of at least n floats, or a new one. */
static pending_send *send_buffer(dmrt_comm *c, const comm_call *call, int64_t n) {
    mpi_comm_state *cs = c->impl;
    pending_send *free_slot = NULL;
    for (int i = 0; i < cs->n_sends; i++) {
        pending_send *p = &cs->sends[i];
        if (p->req != MPI_REQUEST_NULL) continue;
        if (p->capacity >= n) return p;
        if (!free_slot) free_slot = p;
    }
    if (!free_slot) {
        if (cs->n_sends == cs->sends_cap) {
            int cap = cs->sends_cap ? 2 * cs->sends_cap : 4;
            pending_send *grown = realloc(cs->sends, sizeof *grown * (size_t)cap);
            if (!grown) {
                dmrt_comm_fail(c, call, "out of memory for send buffers");
                return NULL;
            }
            cs->sends = grown;
            cs->sends_cap = cap;
        }
        free_slot = &cs->sends[cs->n_sends++];
        *free_slot = (pending_send){MPI_REQUEST_NULL, NULL, 0};
    }
    float *data = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!data) {
        dmrt_comm_fail(c, call, "out of memory buffering %lld floats", (long long)n);
        return NULL;
    }
    free(free_slot->data);
    free_slot->data = data;
    free_slot->capacity = n;
    return free_slot;
}

static int mpi_send(dmrt_comm *c, int peer, const float *buf, int64_t n, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call) || progress_sends(c, call)) return DMRT_ERR_COMM;
    int64_t off = 0;
    do {  /* one message per piece; an empty message for n == 0 */
        int len = (int)(n - off < MPI_CHUNK ? n - off : MPI_CHUNK);
        pending_send *p = send_buffer(c, call, len);
        if (!p) return DMRT_ERR_COMM;
        if (len > 0) memcpy(p->data, buf + off, (size_t)len * sizeof(float));
        MPI_CHECK(c, call, MPI_Isend(p->data, len, MPI_FLOAT, peer, TAG_P2P + call->tag, cs->comm, &p->req));
        off += len;
    } while (off < n);
    return 0;
}

static int mpi_recv(dmrt_comm *c, int peer, float *buf, int64_t n, const comm_call *call) {
    if (mpi_enter(c, call) || progress_sends(c, call)) return DMRT_ERR_COMM;
    int64_t off = 0;
    do {
        int len = (int)(n - off < MPI_CHUNK ? n - off : MPI_CHUNK);
        MPI_Message m;
        MPI_Status st;
        if (wait_for(c, call, NULL, peer, TAG_P2P + call->tag, &m, &st)) return DMRT_ERR_COMM;
        int got = 0;
        MPI_CHECK(c, call, MPI_Get_count(&st, MPI_FLOAT, &got));
        if (got != len) {
            /* Take the message anyway, so the pair's order stays intact. */
            float *sink = malloc((size_t)(got ? got : 1) * sizeof(float));
            if (!sink) return dmrt_comm_fail(c, call, "out of memory taking a message of wrong size");
            char mpi_msg[COMM_ERROR_MAX];
            int ok = MPI_OK(MPI_Mrecv(sink, got, MPI_FLOAT, &m, MPI_STATUS_IGNORE), mpi_msg,
                            sizeof mpi_msg);
            free(sink);
            if (!ok) return mpi_failed(c, call, mpi_msg);
            return dmrt_comm_fail(c, call, "rank %d sent %lld floats, this recv expects %lld",
                             c->members[peer], (long long)(off + got), (long long)n);
        }
        MPI_Request req;
        MPI_CHECK(c, call, MPI_Imrecv(buf + off, len, MPI_FLOAT, &m, &req));
        if (wait_request(c, call, &req)) return DMRT_ERR_COMM;
        off += len;
    } while (off < n);
    return 0;
}

static int mpi_probe(dmrt_comm *c, int peer, const comm_call *call) {
    mpi_comm_state *cs = c->impl;
    if (mpi_enter(c, call) || progress_sends(c, call)) return DMRT_ERR_COMM;
    int waiting = 0;
    MPI_CHECK(c, call, MPI_Iprobe(peer, TAG_P2P + call->tag, cs->comm, &waiting, MPI_STATUS_IGNORE));
    return waiting != 0;
}

/* ---- communicators ------------------------------------------------------------------------- */

static int attach(dmrt_comm *c, MPI_Comm comm, const comm_call *call) {
    mpi_comm_state *cs = calloc(1, sizeof *cs);
    int *counts = calloc(4 * (size_t)c->size, sizeof *counts);
    const float **srcs = calloc((size_t)c->size, sizeof *srcs);
    if (!cs || !counts || !srcs) {
        free(cs);
        free(counts);
        free(srcs);
        return dmrt_comm_fail(c, call, "out of memory creating the communicator");
    }
    cs->comm = comm;
    cs->counts = counts;
    cs->srcs = srcs;
    c->impl = cs;
    return 0;
}

static int mpi_comm_create(dmrt_comm *c, uint64_t seq, const comm_call *call) {
    (void)seq;  /* MPI_Comm_split matches the ranks itself */
    mpi_comm_state *world = c->rank->world.impl;
    MPI_Comm comm;
    /* Color: the group's first world rank; key: the coordinate on the axis. All ranks were
     * at a barrier with the deadline just before (dmrt_mesh_init), so this returns. */
    MPI_CHECK(c, call, MPI_Comm_split(world->comm, c->members[0], c->me, &comm));
    MPI_CHECK(c, call, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    int size = 0, me = -1;
    MPI_CHECK(c, call, MPI_Comm_size(comm, &size));
    MPI_CHECK(c, call, MPI_Comm_rank(comm, &me));
    if (size != c->size || me != c->me)
        return dmrt_comm_fail(c, call, "MPI_Comm_split gave rank %d of %d, expected %d of %d", me,
                         size, c->me, c->size);
    return attach(c, comm, call);
}

/* A rank outside the mesh takes part in the world's MPI_Comm_split of each axis with no
 * color: it gets no communicator. */
static int mpi_comm_skip(dmrt_rank *r, const comm_call *call) {
    mpi_comm_state *world = r->world.impl;
    MPI_Comm none = MPI_COMM_NULL;
    MPI_CHECK(&r->world, call, MPI_Comm_split(world->comm, MPI_UNDEFINED, 0, &none));
    if (none != MPI_COMM_NULL) MPI_WARN(MPI_Comm_free(&none));
    return 0;
}

static void mpi_comm_destroy(dmrt_comm *c) {
    mpi_comm_state *cs = c->impl;
    if (!cs) return;
    mpi_rank_state *rs = c->rank->impl;
    for (int i = 0; i < cs->n_sends; i++) {
        /* A send never received: MPI delivers it or drops it at MPI_Finalize; its data
         * must outlive that. */
        if (cs->sends[i].req != MPI_REQUEST_NULL) {
            MPI_WARN(MPI_Request_free(&cs->sends[i].req));
            bury(rs, cs->sends[i].data);
        } else {
            free(cs->sends[i].data);
        }
    }
    free(cs->sends);
    if (cs->abandoned) {
        bury(rs, cs->work);  /* an abandoned collective may still write into it */
    } else {
        free(cs->work);
        MPI_WARN(MPI_Comm_free(&cs->comm));
    }
    free(cs->counts);
    free(cs->srcs);
    free(cs);
    c->impl = NULL;
}

static const dmrt_comm_backend mpi_backend = {
    .name = "mpi",
    .comm_create = mpi_comm_create,
    .comm_destroy = mpi_comm_destroy,
    .allreduce_sum = mpi_allreduce,
    .allgather = mpi_allgather,
    .reduce_scatter_sum = mpi_reduce_scatter,
    .alltoall = mpi_alltoall,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .probe = mpi_probe,
    .comm_skip = mpi_comm_skip,
    .abort = mpi_abort_notice,
};

/* ---- the launcher ---------------------------------------------------------------------------- */

/* What every rank contributes to the final agreement. */
typedef struct outcome {
    int status;
    int originated;  /* failed on its own rather than after another rank's notice */
} outcome;

/* Polls the agreement with the deadline, receiving notices meanwhile. Returns 0, or 1
 * with msg set. */
static int agree(dmrt_rank *r, outcome *mine, outcome *all, char *msg, size_t size) {
    mpi_rank_state *rs = r->impl;
    MPI_Request req;
    if (!MPI_OK(MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, rs->control, &req), msg, size))
        return 1;
    double timeout = rs->end_timeout > r->timeout ? rs->end_timeout : r->timeout;
    double start = dmrt_comm_now(), deadline = start + timeout;
    for (;;) {
        int done = 0;
        if (!MPI_OK(MPI_Test(&req, &done, MPI_STATUS_IGNORE), msg, size)) return 1;
        if (done) return 0;
        if (receive_notices(r, msg, size)) return 1;
        double now = dmrt_comm_now();
        if (now >= deadline) {
            dmrt_comm_format(msg, size, "not every rank reached the end of the run within %g s%s%s",
                        timeout, rs->failed_rank >= 0 ? "; a rank failed: " : "",
                        rs->failed_rank >= 0 ? notice_of(rs, rs->failed_rank) : "");
            return 1;
        }
        back_off(now - start);
    }
}

/* Waits (with the deadline) for rank src's abort notice, which it sent before agreeing. */
static void await_notice(dmrt_rank *r, int src) {
    mpi_rank_state *rs = r->impl;
    char msg[COMM_ERROR_MAX];
    double start = dmrt_comm_now();
    while (!rs->notices[src] && dmrt_comm_now() - start < rs->end_timeout) {
        if (receive_notices(r, msg, sizeof msg)) return;
        back_off(dmrt_comm_now() - start);
    }
}

static int run_fail(char *err, size_t errlen, const char *fmt, ...) COMM_PRINTF(3, 4);
static int run_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return DMRT_ERR_COMM;
}

static void free_rank(dmrt_rank *r) {
    mpi_rank_state *rs = r->impl;
    dmrt_comm_rank_release(r);  /* the mesh */
    mpi_comm_destroy(&r->world);
    if (rs) {
        for (int i = 0; rs->notice_sends && i < r->count; i++)
            if (rs->notice_sends[i] != MPI_REQUEST_NULL)
                MPI_WARN(MPI_Request_free(&rs->notice_sends[i]));
    }
}

int dmrt_mpi_run(int *argc, char ***argv, dmrt_rank_main rank_main, void *arg, char *err,
                 size_t errlen) {
    char msg[COMM_ERROR_MAX];
    if (err && errlen) err[0] = 0;
    if (!rank_main) return run_fail(err, errlen, "dmrt_mpi_run: no rank_main");
    int initialized = 0, finalized = 0;
    if (!MPI_OK(MPI_Initialized(&initialized), msg, sizeof msg) ||
        !MPI_OK(MPI_Finalized(&finalized), msg, sizeof msg))
        return run_fail(err, errlen, "dmrt_mpi_run: %s", msg);
    if (initialized || finalized)
        return run_fail(err, errlen, "dmrt_mpi_run: MPI is already %s; it runs once per process",
                        finalized ? "finalized" : "initialized");
    int provided = 0;
    if (!MPI_OK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), msg, sizeof msg))
        return run_fail(err, errlen, "dmrt_mpi_run: %s", msg);

    int id = 0, count = 0, status = 0;
    dmrt_rank *r = calloc(1, sizeof *r);
    mpi_rank_state *rs = calloc(1, sizeof *rs);
    if (!r || !rs) {
        free(r);
        free(rs);
        MPI_WARN(MPI_Finalize());
        return run_fail(err, errlen, "dmrt_mpi_run: out of memory");
    }
    MPI_Comm world = MPI_COMM_NULL, control = MPI_COMM_NULL;
    if (!MPI_OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), msg, sizeof msg) ||
        !MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &id), msg, sizeof msg) ||
        !MPI_OK(MPI_Comm_size(MPI_COMM_WORLD, &count), msg, sizeof msg) ||
        !MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &world), msg, sizeof msg) ||
        !MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &control), msg, sizeof msg)) {
        free(r);
        free(rs);
        MPI_WARN(MPI_Finalize());
        return run_fail(err, errlen, "dmrt_mpi_run: %s", msg);
    }
    rs->control = control;
    rs->failed_rank = -1;
    rs->notices = calloc((size_t)count, sizeof *rs->notices);
    rs->notice_sends = malloc(sizeof *rs->notice_sends * (size_t)count);
    for (int i = 0; rs->notice_sends && i < count; i++) rs->notice_sends[i] = MPI_REQUEST_NULL;
    /* Every rank reads the same environment, so they all fail here alike, or none does. */
    if (!rs->notices || !rs->notice_sends ||
        dmrt_comm_rank_init(r, id, count, &mpi_backend, err, errlen) != 0) {
        if (!rs->notices || !rs->notice_sends) run_fail(err, errlen, "dmrt_mpi_run: out of memory");
        free(rs->notices);
        free(rs->notice_sends);
        free(r->world.members);
        free(r);
        free(rs);
        MPI_WARN(MPI_Finalize());
        return DMRT_ERR_COMM;
    }
    r->impl = rs;
    rs->end_timeout = r->timeout;
    comm_call setup = {COMM_OP_BARRIER, "setup", 0, 0};
    if (attach(&r->world, world, &setup) != 0) {
        dmrt_comm_format(msg, sizeof msg, "%s", r->error);
        status = DMRT_ERR_COMM;
        dmrt_rank_abort(r, msg);
    } else {
        status = rank_main(r, arg);
        if (status != 0 && !r->failed) {
            if (r->error[0]) dmrt_comm_format(msg, sizeof msg, "%s", dmrt_comm_error_body(r));
            else dmrt_comm_format(msg, sizeof msg, "its main function returned %d", status);
            dmrt_rank_abort(r, msg);
        }
    }

    outcome mine = {status, status != 0 && r->failed && rs->originated};
    outcome *all = calloc((size_t)count, sizeof *all);
    if (!all || agree(r, &mine, all, msg, sizeof msg) != 0) {
        /* The last resort: without the agreement no rank can know that the others will
         * reach MPI_Finalize. */
        fprintf(stderr, "dmrt_mpi_run: rank %d: %s; calling MPI_Abort\n", id,
                all ? msg : "out of memory");
        if (r->failed) fprintf(stderr, "dmrt_mpi_run: %s\n", r->error);
        fflush(stderr);
        MPI_WARN(MPI_Abort(MPI_COMM_WORLD, status ? status : DMRT_ERR_COMM));
    }
    /* The first failure: the lowest rank that failed on its own, else the lowest that
     * failed; every rank computes the same. */
    int first = -1;
    for (int i = 0; i < count && first < 0; i++)
        if (all[i].status != 0 && all[i].originated) first = i;
    for (int i = 0; i < count && first < 0; i++)
        if (all[i].status != 0) first = i;
    int rc = 0;
    if (first >= 0) {
        rc = all[first].status;
        char text[2 * COMM_ERROR_MAX];
        if (first != id) await_notice(r, first);
        dmrt_comm_format(text, sizeof text, "rank %d failed: %s (status %d)", first,
                    first == id ? r->abort_message : notice_of(rs, first), rc);
        int others = 0;
        for (int i = 0; i < count; i++) others += i != first && all[i].status != 0;
        for (int i = 0, k = 0; i < count; i++) {
            if (i == first || all[i].status == 0) continue;
            const char *lead = others > 1 ? "; also failed: ranks" : "; also failed: rank";
            dmrt_comm_appendf(text, sizeof text, "%s %d", k++ ? "," : lead, i);
        }
        if (err && errlen) dmrt_comm_format(err, errlen, "%s", text);
    }
    free(all);
    free_rank(r);
    MPI_WARN(MPI_Comm_free(&rs->control));
    MPI_WARN(MPI_Finalize());
    for (int i = 0; i < rs->n_graveyard; i++) free(rs->graveyard[i]);
    free(rs->graveyard);
    for (int i = 0; i < count; i++) free(rs->notices[i]);
    free(rs->notices);
    free(rs->notice_sends);
    free(rs);
    free(r);
    return rc;
}
