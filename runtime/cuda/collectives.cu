/* collectives.cu: dmrt_comm.h's collectives on device buffers, and the NCCL bootstrap.
 *
 * NCCL: one communicator per mesh axis of size > 1, ranked like the host communicator of
 * that axis (NCCL rank = coordinate on the axis), so NCCL's rank-major all-gather blocks
 * are dmrt_comm's. When NCCL was asked for (options or DMRT_GPU_COMM) rather than chosen
 * by AUTO, axes of size 1 get a one-rank NCCL communicator too, so that one GPU can test
 * the NCCL path. The world communicator uses the NCCL communicator of an axis that spans
 * every rank, when there is one.
 * Staged (and, in NCCL mode, a communicator without an NCCL twin): the stream is drained,
 * the data goes through pinned host memory and the host call of the same name, so the
 * sums are the C target's bit for bit.
 * Communicators of one rank without an NCCL twin need no data movement beyond a device
 * copy. Send and recv are always staged (dmrt_send is buffered, ncclSend is not: a send
 * and its receive, issued by separate calls, cannot share an NCCL group; see below). */
#include <stdio.h>
#include <string.h>

#include "gpu_internal.h"

/* ---- the NCCL bootstrap ------------------------------------------------------------------ */

#define ID_WORDS ((int)(NCCL_UNIQUE_ID_BYTES / sizeof(float)))
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId is 128 bytes");

/* Comm rank 0 makes the id and broadcasts it over the host communicator (the floats carry
 * its bytes: dmrt_broadcast copies bits), with one more word saying whether it could, so
 * that a failure there fails every rank instead of leaving them waiting in NCCL. An axis
 * of one rank has nobody to tell. */
static int join_axis(dmrt_gpu *g, dmrt_comm *c) {
    const char *axis = dmrt_comm_axis_name(c);
    const int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    float msg[ID_WORDS + 1];
    memset(msg, 0, sizeof msg);
    ncclResult_t made = ncclSuccess;
    if (me == 0) {
        ncclUniqueId id;
        made = ncclGetUniqueId(&id);
        if (made == ncclSuccess) {
            memcpy(msg, &id, sizeof id);
            msg[ID_WORDS] = 1.0f;
        }
    }
    char label[96];
    snprintf(label, sizeof label, "NCCL id of mesh axis %s", axis);
    if (size > 1 && dmrt_broadcast(c, 0, msg, ID_WORDS + 1, label) != 0)
        return dmrt_gpu_fail(g, DMRT_ERR_COMM, __FILE__, __LINE__, "bootstrap of axis %s: %s",
                             axis, dmrt_rank_error(g->rank));
    if (msg[ID_WORDS] != 1.0f)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "axis %s: comm rank 0 could not make an NCCL id%s%s", axis,
                             me == 0 ? ": " : "", me == 0 ? ncclGetErrorString(made) : "");
    ncclUniqueId id;
    memcpy(&id, msg, sizeof id);
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRank(&nc, size, id, me);
    if (r != ncclSuccess)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "ncclCommInitRank(axis %s, %d ranks, rank %d) on %s failed: %s (%s)",
                             axis, size, me, g->name, ncclGetErrorString(r), ncclGetLastError(NULL));
    gpu_nccl_comm *e = &g->nccl[g->n_nccl++];
    e->comm = c;
    e->nccl = nc;
    e->pending = 0;
    return DMRT_OK;
}

/* Every rank walks its axes in the same order, so the members of each axis meet in
 * ncclCommInitRank together. Axes of size 1 only when NCCL was asked for: AUTO leaves
 * their collectives to device copies. */
int dmrt_gpu_nccl_init(dmrt_gpu *g) {
    const int axes = dmrt_mesh_axes(g->rank);
    for (int a = 0; a < axes && a < DMRT_MESH_MAX_AXES; a++) {
        dmrt_comm *c = dmrt_mesh_axis(g->rank, a);
        if (!c || (dmrt_comm_size(c) <= 1 && !g->nccl_every_axis)) continue;
        int rc = join_axis(g, c);
        if (rc != DMRT_OK) return rc;
    }
    return DMRT_OK;
}

void dmrt_gpu_nccl_destroy(dmrt_gpu *g) {
    /* after a failure a peer may be gone, or stopped inside a collective: ncclCommDestroy
     * would wait for it, where ncclCommAbort does not */
    for (int i = 0; i < g->n_nccl; i++)
        if (g->nccl[i].nccl) (void)(g->error[0] ? ncclCommAbort(g->nccl[i].nccl) : ncclCommDestroy(g->nccl[i].nccl));
    g->n_nccl = 0;
}

/* ---- choosing the path --------------------------------------------------------------------- */

/* The index in g->nccl of c's NCCL twin, or -1: staged (or, one rank, a device copy). */
static int nccl_index(const dmrt_gpu *g, const dmrt_comm *c) {
    if (g->comm_mode != DMRT_GPU_COMM_NCCL || !c) return -1;
    for (int i = 0; i < g->n_nccl; i++)
        if (g->nccl[i].comm == c) return i;
    /* a mesh axis over every rank has the world's members in the world's order */
    if (c == dmrt_rank_world(g->rank))
        for (int i = 0; i < g->n_nccl; i++)
            if (dmrt_comm_size(g->nccl[i].comm) == dmrt_comm_size(c)) return i;
    return -1;
}

static gpu_nccl_comm *nccl_of(dmrt_gpu *g, dmrt_comm *c) {
    const int i = nccl_index(g, c);
    return i < 0 ? NULL : &g->nccl[i];
}

const char *dmrt_gpu_comm_mode_name(const dmrt_gpu *g) {
    return g && g->comm_mode == DMRT_GPU_COMM_NCCL ? "nccl" : "staged";
}

const char *dmrt_gpu_comm_path(const dmrt_gpu *g, const dmrt_comm *c) {
    if (!g || !c) return "";
    if (nccl_index(g, c) >= 0) return "nccl";
    return dmrt_comm_size(c) == 1 ? "local" : "staged";
}

/* Before an NCCL call on the main stream: any allreduce started on the comm stream goes
 * first (the host communicators' rule: other calls on c wait for started ones). */
static int nccl_ready(dmrt_gpu *g, gpu_nccl_comm *nc) {
    if (g->nccl_aborted || !nc->nccl)
        return dmrt_gpu_fail(g, DMRT_ERR_COMM, __FILE__, __LINE__,
                             "NCCL communicators were aborted after an earlier failure");
    if (!nc->pending) return DMRT_OK;
    CUDA_CHECK(g, cudaEventRecord(g->wait_event, g->comm_stream));
    CUDA_CHECK(g, cudaStreamWaitEvent(g->stream, g->wait_event, 0));
    for (int i = 0; i < g->n_nccl; i++) g->nccl[i].pending = 0;  /* one comm stream: all done */
    return DMRT_OK;
}

int dmrt_gpu_nccl_join(dmrt_gpu *g) {
    for (int i = 0; i < g->n_nccl; i++)
        if (g->nccl[i].pending && g->nccl[i].nccl) return nccl_ready(g, &g->nccl[i]);
    return DMRT_OK;
}

static int check_call(dmrt_gpu *g, dmrt_comm *c, int64_t n, const char *op, const char *what) {
    if (!c)
        return dmrt_gpu_fail(g, DMRT_ERR_COMM, __FILE__, __LINE__, "%s (%s) on a NULL communicator",
                             op, what ? what : "unlabelled");
    if (n < 0)
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__, "%s (%s): negative count %lld",
                             op, what ? what : "unlabelled", (long long)n);
    return DMRT_OK;
}

/* The host call failed: its message (naming rank, axis, label and step) is the rank's. */
static int host_failed(dmrt_gpu *g, dmrt_comm *c) {
    snprintf(g->error, sizeof g->error, "%s", dmrt_rank_error(dmrt_comm_owner(c)));
    return DMRT_ERR_COMM;
}

/* ---- staging ------------------------------------------------------------------------------- */

/* Drains the stream (the device data is final, and no earlier copy still reads the
 * staging buffer), then *h = at least floats of pinned memory. */
static int stage_begin(dmrt_gpu *g, int64_t floats, float **h) {
    int rc = dmrt_gpu_wait_stream(g, g->stream);
    if (rc != DMRT_OK) return rc;
    return dmrt_gpu_staging(g, (size_t)floats * sizeof(float), h);
}

static int stage_out(dmrt_gpu *g, float *host, const float *dev, int64_t n) {
    if (n == 0) return DMRT_OK;
    CUDA_CHECK(g, cudaMemcpyAsync(host, dev, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                                  g->stream));
    return dmrt_gpu_wait_stream(g, g->stream);
}

/* Asynchronous: the next staged call drains the stream before it touches the staging. */
static int stage_in(dmrt_gpu *g, float *dev, const float *host, int64_t n) {
    if (n == 0) return DMRT_OK;
    CUDA_CHECK(g, cudaMemcpyAsync(dev, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice,
                                  g->stream));
    return DMRT_OK;
}

static int device_copy(dmrt_gpu *g, float *dst, const float *src, int64_t n) {
    if (n == 0 || dst == src) return DMRT_OK;
    CUDA_CHECK(g, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                                  g->stream));
    return DMRT_OK;
}

/* ---- collectives ----------------------------------------------------------------------------- */

int dmrt_gpu_allreduce_sum(dmrt_gpu *g, dmrt_comm *c, float *buf, int64_t n, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "allreduce", what);
    if (rc != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc && dmrt_comm_size(c) == 1) return DMRT_OK;
    if (nc) {
        if ((rc = nccl_ready(g, nc)) != DMRT_OK || n == 0) return rc;
        NCCL_CHECK(g, nc->nccl, ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, nc->nccl,
                                              g->stream));
        return DMRT_OK;
    }
    float *h;
    if ((rc = stage_begin(g, n, &h)) != DMRT_OK || (rc = stage_out(g, h, buf, n)) != DMRT_OK)
        return rc;
    if (dmrt_allreduce_sum(c, n ? h : NULL, n, what) != 0) return host_failed(g, c);
    return stage_in(g, buf, h, n);
}

int dmrt_gpu_allgather(dmrt_gpu *g, dmrt_comm *c, const float *send, float *recv,
                       int64_t n_per_rank, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n_per_rank, "allgather", what);
    if (rc != DMRT_OK) return rc;
    const int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc && size == 1) return device_copy(g, recv, send, n_per_rank);
    if (nc) {
        if ((rc = nccl_ready(g, nc)) != DMRT_OK || n_per_rank == 0) return rc;
        NCCL_CHECK(g, nc->nccl, ncclAllGather(send, recv, (size_t)n_per_rank, ncclFloat, nc->nccl,
                                              g->stream));
        return DMRT_OK;
    }
    const int64_t total = size * n_per_rank;
    float *h;
    if ((rc = stage_begin(g, total, &h)) != DMRT_OK) return rc;
    /* in place on the host: this rank's block already sits at its place */
    float *mine = total ? h + me * n_per_rank : NULL;
    if ((rc = stage_out(g, mine, send, n_per_rank)) != DMRT_OK) return rc;
    if (dmrt_allgather(c, mine, total ? h : NULL, n_per_rank, what) != 0) return host_failed(g, c);
    return stage_in(g, recv, h, total);
}

int dmrt_gpu_reduce_scatter_sum(dmrt_gpu *g, dmrt_comm *c, const float *send, float *recv,
                                int64_t n_per_rank, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n_per_rank, "reduce-scatter", what);
    if (rc != DMRT_OK) return rc;
    const int size = dmrt_comm_size(c);
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc && size == 1) return device_copy(g, recv, send, n_per_rank);
    if (nc) {
        if ((rc = nccl_ready(g, nc)) != DMRT_OK || n_per_rank == 0) return rc;
        NCCL_CHECK(g, nc->nccl, ncclReduceScatter(send, recv, (size_t)n_per_rank, ncclFloat,
                                                  ncclSum, nc->nccl, g->stream));
        return DMRT_OK;
    }
    const int64_t total = size * n_per_rank;
    float *h;
    if ((rc = stage_begin(g, total + n_per_rank, &h)) != DMRT_OK ||
        (rc = stage_out(g, h, send, total)) != DMRT_OK)
        return rc;
    float *hs = total ? h : NULL, *hr = total ? h + total : NULL;
    if (dmrt_reduce_scatter_sum(c, hs, hr, n_per_rank, what) != 0) return host_failed(g, c);
    return stage_in(g, recv, hr, n_per_rank);
}

/* NCCL has no all-to-all: a group of sends and receives, one pair per peer. */
static int nccl_alltoall(dmrt_gpu *g, gpu_nccl_comm *nc, int size, const float *send,
                         float *recv, int64_t n) {
    NCCL_CHECK(g, nc->nccl, ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (int peer = 0; peer < size && first == ncclSuccess; peer++) {
        first = ncclSend(send + peer * n, (size_t)n, ncclFloat, peer, nc->nccl, g->stream);
        if (first == ncclSuccess)
            first = ncclRecv(recv + peer * n, (size_t)n, ncclFloat, peer, nc->nccl, g->stream);
    }
    ncclResult_t end = ncclGroupEnd();  /* always closes the group, even after a failure */
    NCCL_CHECK(g, nc->nccl, first);
    NCCL_CHECK(g, nc->nccl, end);
    return DMRT_OK;
}

int dmrt_gpu_alltoall(dmrt_gpu *g, dmrt_comm *c, const float *send, float *recv,
                      int64_t n_per_rank, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n_per_rank, "all-to-all", what);
    if (rc != DMRT_OK) return rc;
    const int size = dmrt_comm_size(c);
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc && size == 1) return device_copy(g, recv, send, n_per_rank);
    if (nc) {
        if ((rc = nccl_ready(g, nc)) != DMRT_OK || n_per_rank == 0) return rc;
        return nccl_alltoall(g, nc, size, send, recv, n_per_rank);
    }
    const int64_t total = size * n_per_rank;
    float *h;
    if ((rc = stage_begin(g, 2 * total, &h)) != DMRT_OK ||
        (rc = stage_out(g, h, send, total)) != DMRT_OK)
        return rc;
    float *hs = total ? h : NULL, *hr = total ? h + total : NULL;
    if (dmrt_alltoall(c, hs, hr, n_per_rank, what) != 0) return host_failed(g, c);
    return stage_in(g, recv, hr, total);
}

/* ---- overlap ----------------------------------------------------------------------------------- */

int dmrt_gpu_allreduce_start(dmrt_gpu *g, dmrt_comm *c, float *buf, int64_t n, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "allreduce", what);
    if (rc != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc) return dmrt_gpu_allreduce_sum(g, c, buf, n, what);  /* at once */
    if (g->nccl_aborted || !nc->nccl) return nccl_ready(g, nc);
    if (n == 0) return DMRT_OK;
    /* the comm stream starts where the main stream is now: buf holds its final values */
    CUDA_CHECK(g, cudaEventRecord(g->start_event, g->stream));
    CUDA_CHECK(g, cudaStreamWaitEvent(g->comm_stream, g->start_event, 0));
    NCCL_CHECK(g, nc->nccl, ncclAllReduce(buf, buf, (size_t)n, ncclFloat, ncclSum, nc->nccl,
                                          g->comm_stream));
    nc->pending = 1;
    return DMRT_OK;
}

int dmrt_gpu_allgather_start(dmrt_gpu *g, dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                             const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n_per_rank, "allgather", what);
    if (rc != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc) return dmrt_gpu_allgather(g, c, send, recv, n_per_rank, what); /* at once */
    if (g->nccl_aborted || !nc->nccl) return nccl_ready(g, nc);
    if (n_per_rank == 0) return DMRT_OK;
    /* as dmrt_gpu_allreduce_start: the comm stream starts where the main stream is now */
    CUDA_CHECK(g, cudaEventRecord(g->start_event, g->stream));
    CUDA_CHECK(g, cudaStreamWaitEvent(g->comm_stream, g->start_event, 0));
    NCCL_CHECK(g, nc->nccl, ncclAllGather(send, recv, (size_t)n_per_rank, ncclFloat, nc->nccl, g->comm_stream));
    nc->pending = 1;
    return DMRT_OK;
}

int dmrt_gpu_comm_wait(dmrt_gpu *g, dmrt_comm *c) {
    GPU_ENTER(g);
    int rc = check_call(g, c, 0, "wait", NULL);
    if (rc != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (!nc || !nc->pending) return DMRT_OK;
    return nccl_ready(g, nc);
}

/* ---- point to point --------------------------------------------------------------------------- */

static int check_peer(dmrt_gpu *g, dmrt_comm *c, int peer, const char *op, const char *what) {
    if (peer < 0 || peer >= dmrt_comm_size(c))
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "%s (%s): peer %d is not a rank of axis %s (%d ranks)", op,
                             what ? what : "unlabelled", peer, dmrt_comm_axis_name(c),
                             dmrt_comm_size(c));
    return DMRT_OK;
}

/* Point to point is always staged, NCCL or not: dmrt_send is buffered (it returns before
 * the peer receives), and the pipeline schedules rely on that. A bare ncclSend completes
 * only when its receive runs, so under 1F1B stage 0's second activation send and stage
 * 1's first gradient send would wait for each other forever. Pipeline messages are one
 * micro-batch's activations: small next to the gradients the collectives reduce. */
/* send and recv, tagged or not (tag < 0: untagged), staged */
static int send_staged(dmrt_gpu *g, dmrt_comm *c, int peer, int tag, const float *buf, int64_t n, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "send", what);
    if (rc != DMRT_OK || (rc = check_peer(g, c, peer, "send", what)) != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (nc && (rc = nccl_ready(g, nc)) != DMRT_OK) return rc;
    float *h;
    if ((rc = stage_begin(g, n, &h)) != DMRT_OK || (rc = stage_out(g, h, buf, n)) != DMRT_OK)
        return rc;
    int sent = tag < 0 ? dmrt_send(c, peer, n ? h : NULL, n, what) : dmrt_send_tagged(c, peer, tag, n ? h : NULL, n, what);
    return sent != 0 ? host_failed(g, c) : DMRT_OK;
}

static int recv_staged(dmrt_gpu *g, dmrt_comm *c, int peer, int tag, float *buf, int64_t n, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "recv", what);
    if (rc != DMRT_OK || (rc = check_peer(g, c, peer, "recv", what)) != DMRT_OK) return rc;
    gpu_nccl_comm *nc = nccl_of(g, c);
    if (nc && (rc = nccl_ready(g, nc)) != DMRT_OK) return rc;
    float *h;
    if ((rc = stage_begin(g, n, &h)) != DMRT_OK) return rc;
    int got = tag < 0 ? dmrt_recv(c, peer, n ? h : NULL, n, what) : dmrt_recv_tagged(c, peer, tag, n ? h : NULL, n, what);
    if (got != 0) return host_failed(g, c);
    return stage_in(g, buf, h, n);
}

int dmrt_gpu_send(dmrt_gpu *g, dmrt_comm *c, int peer, const float *buf, int64_t n, const char *what) {
    return send_staged(g, c, peer, -1, buf, n, what);
}
int dmrt_gpu_recv(dmrt_gpu *g, dmrt_comm *c, int peer, float *buf, int64_t n, const char *what) {
    return recv_staged(g, c, peer, -1, buf, n, what);
}
int dmrt_gpu_send_tagged(dmrt_gpu *g, dmrt_comm *c, int peer, int tag, const float *buf, int64_t n, const char *what) {
    return send_staged(g, c, peer, tag, buf, n, what);
}
int dmrt_gpu_recv_tagged(dmrt_gpu *g, dmrt_comm *c, int peer, int tag, float *buf, int64_t n, const char *what) {
    return recv_staged(g, c, peer, tag, buf, n, what);
}

/* ---- compressed reductions (--compress), staged ------------------------------------------------
 *
 * The gradients, the error-feedback residual and PowerSGD's Q factors (device memory, in
 * the context's grads and state) go through pinned host memory to dmrt_comm.h's call of the
 * same name and back, with that call's work after them: the C target's results, bit for bit. */

/* Q's floats: cols x rank per compressed segment. */
static int64_t powersgd_q_floats(const dmrt_powersgd_segment *segs, int n_segs, int rank) {
    int64_t floats = 0;
    for (int s = 0; s < n_segs; s++)
        if (segs[s].compressed) floats += segs[s].cols * rank;
    return floats;
}

int dmrt_gpu_allreduce_sum_half(dmrt_gpu *g, dmrt_comm *c, float *buf, int64_t n, dmrt_half_format format,
                                const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "allreduce_sum_half", what);
    if (rc != DMRT_OK) return rc;
    const int64_t work = dmrt_allreduce_half_work(n, dmrt_comm_size(c));
    float *h;
    if ((rc = stage_begin(g, n + work, &h)) != DMRT_OK || (rc = stage_out(g, h, buf, n)) != DMRT_OK) return rc;
    if (dmrt_allreduce_sum_half(c, h, n, format, h + n, work, what) != 0) return host_failed(g, c);
    return stage_in(g, buf, h, n);
}

int dmrt_gpu_reduce_scatter_sum_half(dmrt_gpu *g, dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                                     dmrt_half_format format, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n_per_rank, "reduce_scatter_sum_half", what);
    if (rc != DMRT_OK) return rc;
    const int64_t total = dmrt_comm_size(c) * n_per_rank, work = dmrt_reduce_scatter_half_work(n_per_rank, dmrt_comm_size(c));
    float *h;
    if ((rc = stage_begin(g, total + n_per_rank + work, &h)) != DMRT_OK || (rc = stage_out(g, h, send, total)) != DMRT_OK)
        return rc;
    if (dmrt_reduce_scatter_sum_half(c, h, h + total, n_per_rank, format, h + total + n_per_rank, work, what) != 0)
        return host_failed(g, c);
    return stage_in(g, recv, h + total, n_per_rank);
}

int dmrt_gpu_allreduce_topk(dmrt_gpu *g, dmrt_comm *c, float *grads, float *residual, int64_t n,
                            const dmrt_topk_segment *segs, int n_segs, const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "allreduce_topk", what);
    if (rc != DMRT_OK) return rc;
    const int64_t work = dmrt_allreduce_topk_work(segs, n_segs, dmrt_comm_size(c));
    float *h;
    if ((rc = stage_begin(g, 2 * n + work, &h)) != DMRT_OK || (rc = stage_out(g, h, grads, n)) != DMRT_OK ||
        (rc = stage_out(g, h + n, residual, n)) != DMRT_OK)
        return rc;
    if (dmrt_allreduce_topk(c, h, h + n, n, segs, n_segs, h + 2 * n, work, what) != 0) return host_failed(g, c);
    if ((rc = stage_in(g, grads, h, n)) != DMRT_OK) return rc;
    return stage_in(g, residual, h + n, n);
}

int dmrt_gpu_allreduce_powersgd(dmrt_gpu *g, dmrt_comm *c, float *grads, float *residual, float *q, int64_t n,
                                const dmrt_powersgd_segment *segs, int n_segs, int rank, uint64_t seed, int64_t step,
                                const char *what) {
    GPU_ENTER(g);
    int rc = check_call(g, c, n, "allreduce_powersgd", what);
    if (rc != DMRT_OK) return rc;
    const int64_t nq = q ? powersgd_q_floats(segs, n_segs, rank) : 0, work = dmrt_allreduce_powersgd_work(segs, n_segs, rank);
    float *h;
    if ((rc = stage_begin(g, 2 * n + nq + work, &h)) != DMRT_OK || (rc = stage_out(g, h, grads, n)) != DMRT_OK ||
        (rc = stage_out(g, h + n, residual, n)) != DMRT_OK || (rc = stage_out(g, h + 2 * n, q, nq)) != DMRT_OK)
        return rc;
    if (dmrt_allreduce_powersgd(c, h, h + n, q ? h + 2 * n : NULL, n, segs, n_segs, rank, seed, step, h + 2 * n + nq, work,
                                what) != 0)
        return host_failed(g, c);
    if ((rc = stage_in(g, grads, h, n)) != DMRT_OK || (rc = stage_in(g, residual, h + n, n)) != DMRT_OK) return rc;
    return stage_in(g, q, h + 2 * n, nq);
}

int dmrt_gpu_powersgd_init(dmrt_gpu *g, float *q, const dmrt_powersgd_segment *segs, int n_segs, int rank,
                           uint64_t seed) {
    GPU_ENTER(g);
    const int64_t nq = powersgd_q_floats(segs, n_segs, rank);
    float *h;
    int rc = stage_begin(g, nq, &h);
    if (rc != DMRT_OK) return rc;
    dmrt_powersgd_init(h, segs, n_segs, rank, seed);
    if ((rc = stage_in(g, q, h, nq)) != DMRT_OK) return rc;
    return dmrt_gpu_wait_stream(g, g->stream); /* the staging is free again when this returns */
}

/* ---- parameter servers (--param-servers), staged -------------------------------------------- */

/* The floats of a worker's parameters (grads: 0) or gradients (grads: 1) the segments reach. */
static int64_t ps_extent(const dmrt_ps_layout *L, int grads) {
    int64_t end = 0;
    for (int s = 0; s < L->n_segments; s++) {
        const int64_t at = grads ? L->segments[s].grad_at : L->segments[s].param_at;
        if (at + L->segments[s].numel > end) end = at + L->segments[s].numel;
    }
    return end;
}

int dmrt_gpu_ps_start(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L, const float *params, const float *states,
                      int64_t updates) {
    GPU_ENTER(g);
    if (dmrt_rank_id(r) != 0) return DMRT_OK; /* worker 0 starts the servers */
    const int64_t np = ps_extent(L, 0);
    float *h;
    int rc = stage_begin(g, np, &h);
    if (rc != DMRT_OK || (rc = stage_out(g, h, params, np)) != DMRT_OK) return rc;
    if (dmrt_ps_start(r, L, h, states, updates) != 0) {
        snprintf(g->error, sizeof g->error, "%s", dmrt_rank_error(r));
        return DMRT_ERR_COMM;
    }
    return DMRT_OK;
}

int dmrt_gpu_ps_exchange(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L, const float *grads, float *params,
                         int64_t step, double lr) {
    GPU_ENTER(g);
    const int64_t np = ps_extent(L, 0), ng = ps_extent(L, 1);
    float *h;
    int rc = stage_begin(g, np + ng, &h);
    if (rc != DMRT_OK || (rc = stage_out(g, h, params, np)) != DMRT_OK ||
        (grads && (rc = stage_out(g, h + np, grads, ng)) != DMRT_OK))
        return rc;
    if (dmrt_ps_exchange(r, L, grads ? h + np : NULL, h, step, lr) != 0) {
        snprintf(g->error, sizeof g->error, "%s", dmrt_rank_error(r));
        return DMRT_ERR_COMM;
    }
    return stage_in(g, params, h, np);
}

/* The servers' parameters into the device's params: a snapshot's (their state into the host's
 * states), or the final ones (finish_pull) */
static int ps_pull_staged(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L, float *params, int64_t step,
                          float *states, int64_t *updates, int snapshot) {
    const int64_t np = ps_extent(L, 0);
    float *h;
    int rc = stage_begin(g, np, &h);
    /* (the staging holds the device's copy: the parameters the segments do not reach stay) */
    if (rc != DMRT_OK || (rc = stage_out(g, h, params, np)) != DMRT_OK) return rc;
    if ((snapshot ? dmrt_ps_snapshot(r, L, step, h, states, updates) : dmrt_ps_finish_pull(r, L, h)) != 0) {
        snprintf(g->error, sizeof g->error, "%s", dmrt_rank_error(r));
        return DMRT_ERR_COMM;
    }
    return stage_in(g, params, h, np);
}

int dmrt_gpu_ps_snapshot(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L, int64_t step, float *params,
                         float *states, int64_t *updates) {
    GPU_ENTER(g);
    return ps_pull_staged(g, r, L, params, step, states, updates, 1);
}

int dmrt_gpu_ps_finish(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L) {
    GPU_ENTER(g);
    if (dmrt_ps_finish(r, L) != 0) {
        snprintf(g->error, sizeof g->error, "%s", dmrt_rank_error(r));
        return DMRT_ERR_COMM;
    }
    return DMRT_OK;
}

int dmrt_gpu_ps_finish_pull(dmrt_gpu *g, dmrt_rank *r, const dmrt_ps_layout *L, float *params) {
    GPU_ENTER(g);
    return ps_pull_staged(g, r, L, params, 0, NULL, NULL, 0);
}
