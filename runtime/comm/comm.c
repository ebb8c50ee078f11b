/* comm.c: the backend-independent half of dmrt_comm: ranks, the mesh, argument checks,
 * error messages, and the ordered sum that both backends reduce with. */
#include "comm_internal.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TIMEOUT_S 120.0

static const char *const op_names[COMM_OP_COUNT] = {
    [COMM_OP_ALLREDUCE] = "allreduce",
    [COMM_OP_ALLGATHER] = "allgather",
    [COMM_OP_REDUCE_SCATTER] = "reduce-scatter",
    [COMM_OP_ALLTOALL] = "alltoall",
    [COMM_OP_BROADCAST] = "broadcast",
    [COMM_OP_BARRIER] = "barrier",
    [COMM_OP_SEND] = "send",
    [COMM_OP_RECV] = "recv",
    [COMM_OP_PROBE] = "probe",
};

const char *dmrt_comm_op_name(comm_op op) {
    return op >= 0 && op < COMM_OP_COUNT ? op_names[op] : "?";
}

double dmrt_comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void dmrt_comm_format(char *buf, size_t size, const char *fmt, ...) {
    if (!buf || size == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

void dmrt_comm_appendf(char *buf, size_t size, const char *fmt, ...) {
    size_t used = strnlen(buf, size);
    if (used + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, size - used, fmt, ap);
    va_end(ap);
}

/* ---- ranks -------------------------------------------------------------------------- */

static int parse_timeout(double *out, char *err, size_t errlen) {
    const char *s = getenv("DMRT_COMM_TIMEOUT");
    *out = DEFAULT_TIMEOUT_S;
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v > 0) || !isfinite(v)) {
        if (err && errlen) {
            dmrt_comm_format(err, errlen,
                        "DMRT_COMM_TIMEOUT='%s' is not a positive number of seconds", s);
        }
        return -1;
    }
    *out = v;
    return 0;
}

/* this thread's error buffer when it is a helper (dmrt_comm_set_error_sink), else NULL */
static _Thread_local char *error_sink;

int dmrt_comm_rank_init(dmrt_rank *r, int id, int count, const dmrt_comm_backend *backend,
                   char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->id = id;
    r->count = count;
    r->step = -1;
    r->backend = backend;
    if (parse_timeout(&r->timeout, err, errlen) != 0) return -1;
    r->world.rank = r;
    r->world.size = count;
    r->world.me = id;
    dmrt_comm_format(r->world.axis_name, sizeof r->world.axis_name, "world");
    r->world.members = malloc(sizeof(int) * (size_t)count);
    if (!r->world.members) {
        if (err && errlen) dmrt_comm_format(err, errlen, "out of memory for %d ranks", count);
        return -1;
    }
    for (int i = 0; i < count; i++) r->world.members[i] = i;
    r->comms_created = 1;  /* the world is comm 0 */
    return 0;
}

static void free_mesh(dmrt_rank *r) {
    for (int a = 0; a < r->n_axes; a++) {
        dmrt_comm *c = r->axes[a];
        if (!c) continue;
        dmrt_comm_async_stop(c);
        if (c->impl) r->backend->comm_destroy(c);
        free(c->members);
        free(c);
        r->axes[a] = NULL;
    }
    r->n_axes = 0;
}

void dmrt_comm_rank_stop_helpers(dmrt_rank *r) {
    dmrt_comm_async_stop(&r->world);
    for (int a = 0; a < r->n_axes; a++)
        if (r->axes[a]) dmrt_comm_async_stop(r->axes[a]);
}

void dmrt_comm_rank_release(dmrt_rank *r) {
    dmrt_comm_rank_stop_helpers(r);
    dmrt_comm_trace_free(r);
    free_mesh(r);
    free(r->world.members);
    r->world.members = NULL;
}

int dmrt_rank_id(const dmrt_rank *r) { return r->id; }
int dmrt_rank_count(const dmrt_rank *r) { return r->count; }
const char *dmrt_rank_backend(const dmrt_rank *r) { return r->backend->name; }

int dmrt_rank_local_count(const dmrt_rank *r) {
    if (strcmp(r->backend->name, "threads") == 0) return r->count;
    /* one rank per process: the launcher says how many it started on this node */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (!local) local = getenv("MPI_LOCALNRANKS");
    int n = local ? atoi(local) : 0;
    return n > 0 ? n : 1;
}
void dmrt_rank_set_step(dmrt_rank *r, int64_t step) { r->step = step; }
int64_t dmrt_rank_step(const dmrt_rank *r) { return r->step; }
double dmrt_rank_timeout(const dmrt_rank *r) { return r->timeout; }
const char *dmrt_rank_error(const dmrt_rank *r) { return r->error; }
dmrt_comm *dmrt_rank_world(dmrt_rank *r) { return &r->world; }

void dmrt_rank_set_timeout(dmrt_rank *r, double seconds) {
    if (seconds > 0 && isfinite(seconds)) r->timeout = seconds;
}

const char *dmrt_comm_error_body(const dmrt_rank *r) {
    const char *error = error_sink ? error_sink : r->error;
    char prefix[32];
    int len = snprintf(prefix, sizeof prefix, "rank %d: ", r->id);
    if (strncmp(error, prefix, (size_t)len) == 0) return error + len;
    return error;
}

void dmrt_comm_set_error_sink(char *buf) { error_sink = buf; }

char *dmrt_comm_error_buffer(dmrt_rank *r) { return error_sink ? error_sink : r->error; }

int dmrt_comm_claim_abort(dmrt_rank *r) { return !atomic_exchange(&r->abort_claimed, 1); }

void dmrt_rank_abort(dmrt_rank *r, const char *message) {
    if (!dmrt_comm_claim_abort(r)) return;
    if (!message || !*message) message = "aborted";
    /* A rank passing on its own error (dmrt_rank_error) would name itself twice in
     * "rank R failed: rank R: ...": drop that prefix. */
    char prefix[32];
    int len = snprintf(prefix, sizeof prefix, "rank %d: ", r->id);
    if (strncmp(message, prefix, (size_t)len) == 0) message += len;
    /* message may point into r->error: copy it before r->error is rewritten. */
    dmrt_comm_format(r->abort_message, sizeof r->abort_message, "%s", message);
    dmrt_comm_format(dmrt_comm_error_buffer(r), COMM_ERROR_MAX, "rank %d failed: %s", r->id, r->abort_message);
    atomic_store(&r->failed, 1);
    r->backend->abort(r, r->abort_message);
}

/* ---- errors ------------------------------------------------------------------------- */

int dmrt_comm_vfail(dmrt_comm *c, const comm_call *call, const char *fmt, va_list ap) {
    dmrt_rank *r = c->rank;
    char detail[COMM_ERROR_MAX];
    vsnprintf(detail, sizeof detail, fmt, ap);
    /* detail may quote r->error (a failure passed on), so format into a copy first. */
    char msg[COMM_ERROR_MAX];
    dmrt_comm_format(msg, sizeof msg, "rank %d: %s on axis %s", r->id, call->what, c->axis_name);
    if (r->step >= 0) dmrt_comm_appendf(msg, sizeof msg, " at step %lld", (long long)r->step);
    dmrt_comm_appendf(msg, sizeof msg, ": %s", detail);
    memcpy(dmrt_comm_error_buffer(r), msg, sizeof msg);
    return DMRT_ERR_COMM;
}

int dmrt_comm_fail(dmrt_comm *c, const comm_call *call, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = dmrt_comm_vfail(c, call, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- the mesh ----------------------------------------------------------------------- */

int dmrt_mesh_axes(const dmrt_rank *r) { return r->n_axes; }

int dmrt_mesh_find_axis(const dmrt_rank *r, const char *name) {
    for (int a = 0; name && a < r->n_axes; a++)
        if (strcmp(r->axis_names[a], name) == 0) return a;
    return -1;
}

dmrt_comm *dmrt_mesh_axis(dmrt_rank *r, int axis) {
    return axis >= 0 && axis < r->n_axes ? r->axes[axis] : NULL;
}

int dmrt_mesh_coord(const dmrt_rank *r, int axis) {
    return axis >= 0 && axis < r->n_axes ? r->coords[axis] : -1;
}

/* "data=2 x tensor=2" (or "()" for no axes). */
static void mesh_text(char *buf, size_t size, int n_axes, const char *const *names,
                      const int64_t *sizes) {
    buf[0] = 0;
    if (n_axes == 0) dmrt_comm_appendf(buf, size, "()");
    for (int a = 0; a < n_axes; a++)
        dmrt_comm_appendf(buf, size, "%s%s=%lld", a ? " x " : "", names[a], (long long)sizes[a]);
}

static int mesh_fail(dmrt_rank *r, char *err, size_t errlen, const char *fmt, ...)
    COMM_PRINTF(4, 5);
static int mesh_fail(dmrt_rank *r, char *err, size_t errlen, const char *fmt, ...) {
    char detail[COMM_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    dmrt_comm_format(r->error, sizeof r->error, "rank %d: %s", r->id, detail);
    if (err && errlen) dmrt_comm_format(err, errlen, "%s", r->error);
    return DMRT_ERR_COMM;
}

int dmrt_mesh_init(dmrt_rank *r, int n_axes, const char *const *axis_names,
                   const int64_t *axis_sizes, char *err, size_t errlen) {
    return dmrt_mesh_init_outside(r, n_axes, axis_names, axis_sizes, 0, err, errlen);
}

int dmrt_mesh_inside(const dmrt_rank *r) { return !r->outside; }

int dmrt_mesh_init_outside(dmrt_rank *r, int n_axes, const char *const *axis_names,
                           const int64_t *axis_sizes, int outside, char *err, size_t errlen) {
    if (r->failed) return mesh_fail(r, err, errlen, "mesh setup after this rank failed");
    if (n_axes < 0 || n_axes > DMRT_MESH_MAX_AXES)
        return mesh_fail(r, err, errlen, "a mesh has 0 to %d axes, not %d",
                         DMRT_MESH_MAX_AXES, n_axes);
    if (n_axes > 0 && (!axis_names || !axis_sizes))
        return mesh_fail(r, err, errlen, "mesh of %d axes without names or sizes", n_axes);
    for (int a = 0; a < n_axes; a++) {
        const char *name = axis_names[a];
        if (!name || !*name) return mesh_fail(r, err, errlen, "mesh axis %d has no name", a);
        if (strlen(name) >= DMRT_MESH_NAME_MAX)
            return mesh_fail(r, err, errlen, "mesh axis name '%s' is longer than %d bytes",
                             name, DMRT_MESH_NAME_MAX - 1);
        if (strcmp(name, "world") == 0)
            return mesh_fail(r, err, errlen, "'world' names the world, not a mesh axis");
        for (int b = 0; b < a; b++)
            if (strcmp(axis_names[b], name) == 0)
                return mesh_fail(r, err, errlen, "mesh axis '%s' appears twice", name);
        if (axis_sizes[a] < 1)
            return mesh_fail(r, err, errlen, "mesh axis %s has size %lld; sizes are >= 1",
                             name, (long long)axis_sizes[a]);
    }
    /* The product saturates at INT64_MAX: sizes are int64 and may be absurd. */
    int64_t product = 1;
    for (int a = 0; a < n_axes; a++)
        product = product > INT64_MAX / axis_sizes[a] ? INT64_MAX : product * axis_sizes[a];
    if (outside < 0 || product == INT64_MAX || product + outside != r->count) {
        char text[512];
        mesh_text(text, sizeof text, n_axes, axis_names, axis_sizes);
        if (product == INT64_MAX)
            return mesh_fail(r, err, errlen, "mesh %s needs more ranks than int64 counts, the "
                             "run has %d", text, r->count);
        if (outside > 0)
            return mesh_fail(r, err, errlen, "mesh %s and %d rank%s outside it need %lld ranks, the run has %d",
                             text, outside, outside == 1 ? "" : "s", (long long)product + outside, r->count);
        return mesh_fail(r, err, errlen, "mesh %s needs %lld rank%s, the run has %d", text,
                         (long long)product, product == 1 ? "" : "s", r->count);
    }

    /* All ranks are present (with the deadline) before any comm is built, so that a
     * missing rank is reported here rather than inside a backend's setup. */
    if (dmrt_barrier(&r->world, "barrier before the mesh setup") != 0) {
        if (err && errlen) dmrt_comm_format(err, errlen, "%s", r->error);
        return DMRT_ERR_COMM;
    }

    free_mesh(r);
    r->outside = r->id >= product;
    if (r->outside) {
        /* on no axis; the backend may still take part in building the mesh's comms */
        comm_call skip = {COMM_OP_BARRIER, "mesh setup", dmrt_comm_now() + r->timeout, 0};
        for (int a = 0; a < n_axes && r->backend->comm_skip; a++)
            if (r->backend->comm_skip(r, &skip) != 0) {
                if (err && errlen) dmrt_comm_format(err, errlen, "%s", r->error);
                return DMRT_ERR_COMM;
            }
        return 0;
    }
    int coords[DMRT_MESH_MAX_AXES];
    int stride[DMRT_MESH_MAX_AXES];
    for (int a = n_axes - 1, s = 1, rest = r->id; a >= 0; a--) {
        stride[a] = s;
        coords[a] = rest % (int)axis_sizes[a];
        rest /= (int)axis_sizes[a];
        s *= (int)axis_sizes[a];
    }
    r->n_axes = n_axes;
    for (int a = 0; a < n_axes; a++) {
        dmrt_comm_format(r->axis_names[a], sizeof r->axis_names[a], "%s", axis_names[a]);
        r->axis_sizes[a] = (int)axis_sizes[a];
        r->coords[a] = coords[a];
    }
    comm_call call = {COMM_OP_BARRIER, "mesh setup", dmrt_comm_now() + r->timeout, 0};
    for (int a = 0; a < n_axes; a++) {
        dmrt_comm *c = calloc(1, sizeof *c);
        int *members = malloc(sizeof(int) * (size_t)axis_sizes[a]);
        if (!c || !members) {
            free(c);
            free(members);
            free_mesh(r);
            return mesh_fail(r, err, errlen, "out of memory building the mesh");
        }
        c->rank = r;
        c->size = (int)axis_sizes[a];
        c->me = coords[a];
        c->members = members;
        dmrt_comm_format(c->axis_name, sizeof c->axis_name, "%s", axis_names[a]);
        /* Members: this rank with its coordinate on axis a replaced by 0 .. size-1. */
        int base = r->id - coords[a] * stride[a];
        for (int i = 0; i < c->size; i++) members[i] = base + i * stride[a];
        r->axes[a] = c;
        if (r->backend->comm_create(c, r->comms_created++, &call) != 0) {
            free_mesh(r);  /* no half-built mesh: dmrt_mesh_axis gives NULL */
            if (err && errlen) dmrt_comm_format(err, errlen, "%s", r->error);
            return DMRT_ERR_COMM;
        }
    }
    return 0;
}

/* ---- communicators ------------------------------------------------------------------ */

int dmrt_comm_size(const dmrt_comm *c) { return c->size; }
int dmrt_comm_rank(const dmrt_comm *c) { return c->me; }
const char *dmrt_comm_axis_name(const dmrt_comm *c) { return c->axis_name; }
dmrt_rank *dmrt_comm_owner(const dmrt_comm *c) { return c->rank; }

int dmrt_comm_member(const dmrt_comm *c, int i) {
    return i >= 0 && i < c->size ? c->members[i] : -1;
}

void dmrt_comm_slice(int64_t n, int parts, int i, int64_t *lo, int64_t *hi) {
    int64_t lines = (n + 15) / 16;
    int64_t a = lines * i / parts * 16, b = lines * (i + 1) / parts * 16;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

/* Tiles keep the running sums in L1 while the sources stream by. */
#define SUM_TILE 2048

void dmrt_comm_sum_ordered(float *dst, const float *const *srcs, int count, int64_t n) {
    float acc[SUM_TILE];
    for (int64_t j = 0; j < n; j += SUM_TILE) {
        int64_t t = n - j < SUM_TILE ? n - j : SUM_TILE;
        const float *s0 = srcs[0] + j;
        for (int64_t i = 0; i < t; i++) acc[i] = s0[i];
        for (int k = 1; k < count; k++) {
            const float *s = srcs[k] + j;
            for (int64_t i = 0; i < t; i++) acc[i] += s[i];
        }
        memcpy(dst + j, acc, (size_t)t * sizeof(float));
    }
}

/* ---- argument checks, then the backend ---------------------------------------------- */

/* The checks every call shares. Returns 0 when the backend may go on. */
static int begin(dmrt_comm *c, comm_call *call, comm_op op, const char *what, int settle) {
    /* the calls started on c come first (the helper's own calls, made through the
     * comm_*_now functions, pass settle 0) */
    if (settle) dmrt_comm_settle(c);
    call->op = op;
    call->tag = 0;
    call->what = what && *what ? what : dmrt_comm_op_name(op);
    call->deadline = dmrt_comm_now() + c->rank->timeout;
    if (c->rank->failed)
        return dmrt_comm_fail(c, call, "this rank failed before: %s", c->rank->abort_message);
    return 0;
}

static int check_count(dmrt_comm *c, const comm_call *call, int64_t n, int64_t blocks) {
    if (n < 0) return dmrt_comm_fail(c, call, "negative count %lld", (long long)n);
    if (n > INT64_MAX / (int64_t)sizeof(float) / blocks)
        return dmrt_comm_fail(c, call, "%lld floats per rank times %lld ranks overflows",
                         (long long)n, (long long)blocks);
    return 0;
}

static int check_buf(dmrt_comm *c, const comm_call *call, const void *p, int64_t n,
                     const char *which) {
    if (n > 0 && !p) return dmrt_comm_fail(c, call, "%s buffer is NULL for %lld floats", which,
                                      (long long)n);
    return 0;
}

/* send and recv of n_send and n_recv floats must not overlap. */
static int check_disjoint(dmrt_comm *c, const comm_call *call, const float *send,
                          int64_t n_send, const float *recv, int64_t n_recv) {
    if (n_send == 0 || n_recv == 0) return 0;
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    uintptr_t s_end = s + (uintptr_t)n_send * sizeof(float);
    uintptr_t r_end = r + (uintptr_t)n_recv * sizeof(float);
    if (s < r_end && r < s_end) return dmrt_comm_fail(c, call, "send and recv buffers overlap");
    return 0;
}

int dmrt_allreduce_sum(dmrt_comm *c, float *buf, int64_t n, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    dmrt_comm_settle(c);
    return dmrt_comm_allreduce_now(c, buf, n, what);
}

int dmrt_comm_allreduce_now(dmrt_comm *c, float *buf, int64_t n, const char *what) {
    comm_call call;
    if (begin(c, &call, COMM_OP_ALLREDUCE, what, 0) || check_count(c, &call, n, 1) ||
        check_buf(c, &call, buf, n, "the"))
        return DMRT_ERR_COMM;
    return c->rank->backend->allreduce_sum(c, buf, n, &call);
}

int dmrt_allgather(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                   const char *what) {
    if (!c) return DMRT_ERR_COMM;
    dmrt_comm_settle(c);
    return dmrt_comm_allgather_now(c, send, recv, n_per_rank, what);
}

int dmrt_comm_allgather_now(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                       const char *what) {
    comm_call call;
    if (begin(c, &call, COMM_OP_ALLGATHER, what, 0) || check_count(c, &call, n_per_rank, c->size) ||
        check_buf(c, &call, send, n_per_rank, "the send") ||
        check_buf(c, &call, recv, n_per_rank, "the recv"))
        return DMRT_ERR_COMM;
    /* In place (send is this rank's block of recv) is allowed; other overlaps are not. */
    if (send != recv + (int64_t)c->me * n_per_rank &&
        check_disjoint(c, &call, send, n_per_rank, recv, n_per_rank * c->size))
        return DMRT_ERR_COMM;
    return c->rank->backend->allgather(c, send, recv, n_per_rank, &call);
}

int dmrt_reduce_scatter_sum(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                            const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin(c, &call, COMM_OP_REDUCE_SCATTER, what, 1) ||
        check_count(c, &call, n_per_rank, c->size) ||
        check_buf(c, &call, send, n_per_rank, "the send") ||
        check_buf(c, &call, recv, n_per_rank, "the recv") ||
        check_disjoint(c, &call, send, n_per_rank * c->size, recv, n_per_rank))
        return DMRT_ERR_COMM;
    return c->rank->backend->reduce_scatter_sum(c, send, recv, n_per_rank, &call);
}

int dmrt_alltoall(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                  const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin(c, &call, COMM_OP_ALLTOALL, what, 1) || check_count(c, &call, n_per_rank, c->size) ||
        check_buf(c, &call, send, n_per_rank, "the send") ||
        check_buf(c, &call, recv, n_per_rank, "the recv") ||
        check_disjoint(c, &call, send, n_per_rank * c->size, recv, n_per_rank * c->size))
        return DMRT_ERR_COMM;
    return c->rank->backend->alltoall(c, send, recv, n_per_rank, &call);
}

int dmrt_broadcast(dmrt_comm *c, int root, float *buf, int64_t n, const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin(c, &call, COMM_OP_BROADCAST, what, 1) || check_count(c, &call, n, 1) ||
        check_buf(c, &call, buf, n, "the"))
        return DMRT_ERR_COMM;
    if (root < 0 || root >= c->size)
        return dmrt_comm_fail(c, &call, "root %d is not a rank of this axis (size %d)", root,
                         c->size);
    return c->rank->backend->broadcast(c, root, buf, n, &call);
}

int dmrt_barrier(dmrt_comm *c, const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin(c, &call, COMM_OP_BARRIER, what, 1)) return DMRT_ERR_COMM;
    return c->rank->backend->barrier(c, &call);
}

/* The checks of a send or recv of n floats with peer on channel tag. */
static int begin_p2p(dmrt_comm *c, comm_call *call, comm_op op, int peer, int tag, const float *buf,
                     int64_t n, const char *what) {
    if (begin(c, call, op, what, 1) || check_count(c, call, n, 1) || check_buf(c, call, buf, n, "the"))
        return DMRT_ERR_COMM;
    if (peer < 0 || peer >= c->size)
        return dmrt_comm_fail(c, call, "peer %d is not a rank of this axis (size %d)", peer,
                         c->size);
    if (tag < 0 || tag > DMRT_MAX_TAG)
        return dmrt_comm_fail(c, call, "channel %d is not from 0 to %d", tag, DMRT_MAX_TAG);
    call->tag = tag;
    return 0;
}

int dmrt_send(dmrt_comm *c, int peer, const float *buf, int64_t n, const char *what) {
    return dmrt_send_tagged(c, peer, 0, buf, n, what);
}

int dmrt_recv(dmrt_comm *c, int peer, float *buf, int64_t n, const char *what) {
    return dmrt_recv_tagged(c, peer, 0, buf, n, what);
}

int dmrt_send_tagged(dmrt_comm *c, int peer, int tag, const float *buf, int64_t n, const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin_p2p(c, &call, COMM_OP_SEND, peer, tag, buf, n, what)) return DMRT_ERR_COMM;
    return c->rank->backend->send(c, peer, buf, n, &call);
}

int dmrt_probe_tagged(dmrt_comm *c, int peer, int tag, const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin_p2p(c, &call, COMM_OP_PROBE, peer, tag, NULL, 0, what)) return DMRT_ERR_COMM;
    return c->rank->backend->probe(c, peer, &call);
}

int dmrt_recv_tagged(dmrt_comm *c, int peer, int tag, float *buf, int64_t n, const char *what) {
    comm_call call;
    if (!c) return DMRT_ERR_COMM;
    if (begin_p2p(c, &call, COMM_OP_RECV, peer, tag, buf, n, what)) return DMRT_ERR_COMM;
    return c->rank->backend->recv(c, peer, buf, n, &call);
}
