/* param_server.c: parameter servers over the world communicator (dmrt_ps.h).
 *
 * A push is one message per server: a header (what it is, the worker's step and learning
 * rate, bit for bit) and the gradients of the server's shard. A pull is the shard's
 * parameters. Each kind has a channel of its own, above the pipelines' channels. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "dmrt_ps.h"

enum { TAG_INIT = DMRT_MAX_TAG - 2, TAG_PUSH = DMRT_MAX_TAG - 1, TAG_PULL = DMRT_MAX_TAG };
/* SKIP: a step fp16's loss scaler skipped (no gradients); FINAL: done, and wants the
 * final parameters once every worker is done (dmrt_ps_finish_pull) */
enum { KIND_PUSH = 1, KIND_DONE = 2, KIND_SKIP = 3, KIND_FINAL = 4 };
/* the header: kind, then the step (int64) and the learning rate (double) as 2 floats each */
#define HEADER 5

typedef struct push_header {
    int kind;
    int64_t step;
    double lr;
} push_header;

static void header_write(float *h, int kind, int64_t step, double lr) {
    h[0] = (float)kind;
    memcpy(h + 1, &step, sizeof step);
    memcpy(h + 3, &lr, sizeof lr);
}

static push_header header_read(const float *h) {
    push_header p = {(int)h[0], 0, 0};
    memcpy(&p.step, h + 1, sizeof p.step);
    memcpy(&p.lr, h + 3, sizeof p.lr);
    return p;
}

int64_t dmrt_ps_total(const dmrt_ps_layout *L) {
    int64_t total = 0;
    for (int i = 0; i < L->n_segments; i++) total += L->segments[i].numel;
    return total;
}

void dmrt_ps_shard(const dmrt_ps_layout *L, int s, int64_t *begin, int64_t *end) {
    int64_t total = dmrt_ps_total(L), share = (total + L->servers - 1) / L->servers;
    *begin = s * share < total ? s * share : total;
    *end = (s + 1) * share < total ? (s + 1) * share : total;
}

/* Copies elements [begin, end) of the parameters end to end between the worker's storage
 * (at the segments' param_at or grad_at) and packed. */
static void copy_range(const dmrt_ps_layout *L, int64_t begin, int64_t end, float *storage, int grads, float *packed,
                       int to_packed) {
    int64_t at = 0;
    for (int i = 0; i < L->n_segments && at < end; i++) {
        const dmrt_ps_segment *seg = &L->segments[i];
        int64_t lo = begin > at ? begin : at, hi = end < at + seg->numel ? end : at + seg->numel;
        if (lo < hi) {
            float *mine = storage + (grads ? seg->grad_at : seg->param_at) + (lo - at);
            if (to_packed) memcpy(packed + (lo - begin), mine, (size_t)(hi - lo) * sizeof(float));
            else memcpy(mine, packed + (lo - begin), (size_t)(hi - lo) * sizeof(float));
        }
        at += seg->numel;
    }
}

static int64_t largest_shard(const dmrt_ps_layout *L) {
    int64_t b, e;
    dmrt_ps_shard(L, 0, &b, &e);
    return e - b;
}

static int fail(dmrt_rank *r, const char *what, const char *message) {
    comm_call call = {COMM_OP_SEND, what, 0, 0};
    return dmrt_comm_fail(dmrt_rank_world(r), &call, "%s", message);
}

/* Worker 0 sends each server its shard of the parameters. */
static int send_initial(dmrt_rank *r, const dmrt_ps_layout *L, const float *params, float *buf) {
    for (int s = 0; s < L->servers; s++) {
        int64_t b, e;
        dmrt_ps_shard(L, s, &b, &e);
        copy_range(L, b, e, (float *)params, 0, buf, 1);
        if (dmrt_send_tagged(dmrt_rank_world(r), L->workers + s, TAG_INIT, buf, e - b, "the parameters, to their server"))
            return DMRT_ERR_COMM;
    }
    return 0;
}

/* Sends every server a header of this kind and, for a push, its shard of grads. */
static int push(dmrt_rank *r, const dmrt_ps_layout *L, int kind, const float *grads, int64_t step, double lr,
                float *buf) {
    for (int s = 0; s < L->servers; s++) {
        int64_t b, e;
        dmrt_ps_shard(L, s, &b, &e);
        header_write(buf, kind, step, lr);
        if (kind == KIND_PUSH) copy_range(L, b, e, (float *)grads, 1, buf + HEADER, 1);
        else memset(buf + HEADER, 0, (size_t)(e - b) * sizeof(float));
        if (dmrt_send_tagged(dmrt_rank_world(r), L->workers + s, TAG_PUSH, buf, HEADER + e - b,
                             kind == KIND_DONE || kind == KIND_FINAL ? "done, to the servers"
                                                                     : "the gradients, to their server"))
            return DMRT_ERR_COMM;
    }
    return 0;
}

/* Every server's shard of the parameters into params. */
static int pull(dmrt_rank *r, const dmrt_ps_layout *L, float *params, float *buf) {
    int rc = 0;
    for (int s = 0; rc == 0 && s < L->servers; s++) {
        int64_t b, e;
        dmrt_ps_shard(L, s, &b, &e);
        rc = dmrt_recv_tagged(dmrt_rank_world(r), L->workers + s, TAG_PULL, buf, e - b, "the parameters, from their server");
        if (rc == 0) copy_range(L, b, e, params, 0, buf, 0);
    }
    return rc;
}

int dmrt_ps_exchange(dmrt_rank *r, const dmrt_ps_layout *L, int first, const float *grads, float *params,
                     int64_t step, double lr) {
    float *buf = malloc((size_t)(HEADER + largest_shard(L)) * sizeof(float));
    if (!buf) return fail(r, "the gradients, to their server", "out of memory for a push");
    int rc = first && dmrt_rank_id(r) == 0 ? send_initial(r, L, params, buf) : 0;
    if (rc == 0) rc = push(r, L, grads ? KIND_PUSH : KIND_SKIP, grads, step, lr, buf);
    if (rc == 0) rc = pull(r, L, params, buf);
    free(buf);
    return rc;
}

/* done (KIND_DONE), or done and the final parameters into params (KIND_FINAL) */
static int finish(dmrt_rank *r, const dmrt_ps_layout *L, int kind, int pushed, float *params) {
    float *buf = malloc((size_t)(HEADER + largest_shard(L)) * sizeof(float));
    if (!buf) return fail(r, "done, to the servers", "out of memory");
    int rc = !pushed && dmrt_rank_id(r) == 0 ? send_initial(r, L, params, buf) : 0;
    if (rc == 0) rc = push(r, L, kind, NULL, 0, 0, buf);
    if (rc == 0 && kind == KIND_FINAL) rc = pull(r, L, params, buf);
    free(buf);
    return rc;
}

int dmrt_ps_finish(dmrt_rank *r, const dmrt_ps_layout *L, int pushed, const float *params) {
    return finish(r, L, KIND_DONE, pushed, (float *)params); /* params only read: no pull */
}

int dmrt_ps_finish_pull(dmrt_rank *r, const dmrt_ps_layout *L, int pushed, float *params) {
    return finish(r, L, KIND_FINAL, pushed, params);
}

/* ---- the server ----------------------------------------------------------------------- */

typedef struct server {
    dmrt_rank *r;
    const dmrt_ps_layout *L;
    dmrt_ps_step step;
    int64_t n;              /* the shard's elements */
    float *param, *sum;     /* (n) */
    float *state[2];        /* (n) each, the first L->states of them */
    float *msg;             /* (HEADER + n) */
    char *wants_final;      /* (workers) the worker said it is done with KIND_FINAL */
    dmrt_ps_stats *stats;
} server;

static void apply(server *sv, const float *grad, double lr) {
    sv->step.step = ++sv->stats->updates;
    sv->step.lr = lr;
    sv->L->update(&sv->step, sv->param, grad, sv->state, sv->n);
}

static int receive_push(server *sv, int w, push_header *h) {
    double start = dmrt_comm_now();
    int rc = dmrt_recv_tagged(dmrt_rank_world(sv->r), w, TAG_PUSH, sv->msg, HEADER + sv->n, "a push, from its worker");
    sv->stats->waited_seconds += dmrt_comm_now() - start;
    if (rc) return rc;
    *h = header_read(sv->msg);
    if (h->kind != KIND_PUSH && h->kind != KIND_DONE && h->kind != KIND_SKIP && h->kind != KIND_FINAL) {
        char why[128];
        dmrt_comm_format(why, sizeof why, "worker %d sent a push of unknown kind %d", w, h->kind);
        return fail(sv->r, "a push, from its worker", why);
    }
    if (h->kind == KIND_FINAL) sv->wants_final[w] = 1;
    if (h->kind == KIND_FINAL) h->kind = KIND_DONE; /* done either way; the final parameters are sent at the end */
    if (h->kind != KIND_DONE) sv->stats->pushes++;
    if (h->kind == KIND_SKIP) sv->stats->skipped++;
    if (h->kind == KIND_SKIP && sv->L->staleness < 0) {
        char why[128];
        dmrt_comm_format(why, sizeof why, "worker %d skipped step %lld alone: synchronous servers skip a step together", w,
                         (long long)h->step);
        return fail(sv->r, "a push, from its worker", why);
    }
    return 0;
}

static int send_pull(server *sv, int w) {
    return dmrt_send_tagged(dmrt_rank_world(sv->r), w, TAG_PULL, sv->param, sv->n, "the parameters, to their worker");
}

/* Every worker is done: the shard as it ends, to each that asked for it (asynchronous
 * servers apply pushes that come after a worker's last pull). */
static int send_final(server *sv) {
    int rc = 0;
    for (int w = 0; rc == 0 && w < sv->L->workers; w++)
        if (sv->wants_final[w]) rc = send_pull(sv, w);
    return rc;
}

/* Every worker's push of a step, summed in worker order, one update; until they are done. */
static int serve_synchronous(server *sv) {
    const dmrt_ps_layout *L = sv->L;
    for (;;) {
        push_header first, h;
        int rc = receive_push(sv, 0, &first);
        if (rc) return rc;
        if (first.kind == KIND_PUSH) memcpy(sv->sum, sv->msg + HEADER, (size_t)sv->n * sizeof(float));
        for (int w = 1; w < L->workers; w++) {
            if ((rc = receive_push(sv, w, &h))) return rc;
            if (h.kind != first.kind || h.step != first.step) {
                char why[256];
                dmrt_comm_format(why, sizeof why,
                                 "synchronous servers take the workers' steps together: worker 0 %s %lld, worker %d %s %lld",
                                 first.kind == KIND_DONE ? "is done, after step" : "pushed step", (long long)first.step, w,
                                 h.kind == KIND_DONE ? "is done, after step" : "pushed step", (long long)h.step);
                return fail(sv->r, "a push, from its worker", why);
            }
            const float *g = sv->msg + HEADER;
            for (int64_t i = 0; h.kind == KIND_PUSH && i < sv->n; i++) sv->sum[i] += g[i];
        }
        if (first.kind == KIND_DONE) return send_final(sv);
        apply(sv, sv->sum, first.lr);
        for (int w = 0; w < L->workers; w++)
            if ((rc = send_pull(sv, w))) return rc;
    }
}

/* Each push applied as it comes; a worker's pull answered once the slowest worker still
 * training is at most `staleness` steps behind it. */
static int serve_asynchronous(server *sv) {
    const dmrt_ps_layout *L = sv->L;
    int W = L->workers, left = W, rc = 0;
    int64_t *pushes = calloc((size_t)W, sizeof *pushes);
    char *done = calloc((size_t)W, 1), *owed = calloc((size_t)W, 1);
    if (!pushes || !done || !owed) rc = fail(sv->r, "a push, from its worker", "out of memory");
    double last = dmrt_comm_now(), idle_since = -1;
    while (rc == 0 && left > 0) {
        int progressed = 0;
        for (int w = 0; rc == 0 && w < W; w++) {
            if (done[w]) continue;
            int waiting = dmrt_probe_tagged(dmrt_rank_world(sv->r), w, TAG_PUSH, "a push, from its worker");
            if (waiting < 0 || waiting > 1) rc = waiting ? waiting : DMRT_ERR_COMM;
            if (rc || !waiting) continue;
            push_header h;
            if ((rc = receive_push(sv, w, &h))) break;
            progressed = 1;
            if (h.kind == KIND_DONE) {
                done[w] = 1;
                left--;
                continue;
            }
            if (h.kind == KIND_PUSH) apply(sv, sv->msg + HEADER, h.lr);
            pushes[w]++; /* a skipped step counts: the bound is in steps */
            owed[w] = 1;
        }
        int64_t slowest = INT64_MAX;
        for (int w = 0; w < W; w++)
            if (!done[w] && pushes[w] < slowest) slowest = pushes[w];
        for (int w = 0; rc == 0 && w < W; w++)
            if (owed[w] && (slowest == INT64_MAX || pushes[w] - L->staleness <= slowest)) {
                int64_t lead = slowest == INT64_MAX ? 0 : pushes[w] - slowest;
                if (lead > sv->stats->max_lead) sv->stats->max_lead = lead;
                owed[w] = 0;
                rc = send_pull(sv, w);
            }
        double now = dmrt_comm_now();
        if (progressed) {
            if (idle_since >= 0) sv->stats->waited_seconds += now - idle_since;
            idle_since = -1;
            last = now;
        } else if (rc == 0) {
            if (idle_since < 0) idle_since = now;
            if (now - last > dmrt_rank_timeout(sv->r)) {
                char why[128];
                dmrt_comm_format(why, sizeof why, "timed out after %g s: no worker pushed", dmrt_rank_timeout(sv->r));
                rc = fail(sv->r, "a push, from its worker", why);
            }
            /* polls every 50 us at first, every ms once idle for 10 ms (a slow step) */
            struct timespec pause = {0, now - idle_since < 0.01 ? 50 * 1000 : 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    if (rc == 0) rc = send_final(sv);
    free(pushes);
    free(done);
    free(owed);
    return rc;
}

int dmrt_ps_serve(dmrt_rank *r, const dmrt_ps_layout *L, int threads, dmrt_ps_stats *stats) {
    memset(stats, 0, sizeof *stats);
    stats->staleness = L->staleness;
    stats->threads = threads > 0 ? threads : 1;
    int s = dmrt_rank_id(r) - L->workers;
    if (s < 0 || s >= L->servers || L->states < 0 || L->states > 2) {
        char why[160];
        dmrt_comm_format(why, sizeof why, "world rank %d is not one of the %d servers after %d workers", dmrt_rank_id(r),
                         L->servers, L->workers);
        return fail(r, "serving parameters", why);
    }
    server sv = {.r = r, .L = L, .step = {0, 0, threads > 0 ? threads : 1}, .stats = stats};
    int64_t b, e;
    dmrt_ps_shard(L, s, &b, &e);
    sv.n = e - b;
    size_t bytes = (size_t)(sv.n ? sv.n : 1) * sizeof(float);
    sv.param = malloc(bytes);
    sv.sum = malloc(bytes);
    sv.msg = malloc(bytes + HEADER * sizeof(float));
    sv.wants_final = calloc((size_t)L->workers, 1);
    for (int k = 0; k < L->states; k++) sv.state[k] = calloc(1, bytes);
    int rc = 0;
    if (!sv.param || !sv.sum || !sv.msg || !sv.wants_final || (L->states > 0 && !sv.state[0]) || (L->states > 1 && !sv.state[1]))
        rc = fail(r, "serving parameters", "out of memory for the shard");
    if (rc == 0)
        rc = dmrt_recv_tagged(dmrt_rank_world(r), 0, TAG_INIT, sv.param, sv.n, "the parameters, from worker 0");
    if (rc == 0) rc = L->staleness < 0 ? serve_synchronous(&sv) : serve_asynchronous(&sv);
    free(sv.param);
    free(sv.sum);
    free(sv.msg);
    free(sv.wants_final);
    free(sv.state[0]);
    free(sv.state[1]);
    return rc;
}
