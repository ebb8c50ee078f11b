/* param_server.c: parameter servers over the world communicator (dmrt_ps.h).
 *
 * A push is one message per server: a header (what it is, the worker's step and learning
 * rate, bit for bit) and the gradients of the server's shard. A pull is the shard's
 * parameters. A shard whole (worker 0's start, a snapshot's answer) is the updates done
 * (an int64 as 2 floats), the parameters, then each optimizer state's n floats. Each kind
 * has a channel of its own, above the pipelines' channels. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "dmrt_ps.h"

enum { TAG_SNAPSHOT = DMRT_MAX_TAG - 3, TAG_INIT = DMRT_MAX_TAG - 2, TAG_PUSH = DMRT_MAX_TAG - 1, TAG_PULL = DMRT_MAX_TAG };
/* SKIP: a step fp16's loss scaler skipped (no gradients); FINAL: done, and wants the
 * final parameters once every worker is done (dmrt_ps_finish_pull); SNAPSHOT: wants the
 * shard whole (parameters, state, updates) once every worker still training asks too */
enum { KIND_PUSH = 1, KIND_DONE = 2, KIND_SKIP = 3, KIND_FINAL = 4, KIND_SNAPSHOT = 5 };
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

/* The floats of server s's shard whole: updates, parameters, state. */
static int64_t whole_floats(const dmrt_ps_layout *L, int64_t n) { return 2 + n * (1 + L->states); }

/* Part `part` of a shard whole of n elements: 0 the parameters, 1 + k optimizer state k
 * (n floats each, after the update count's 2). */
static float *whole_part(const float *whole, int64_t n, int part) { return (float *)whole + 2 + n * part; }

/* Between the worker's parameters (at param_at) and its states (states[k * total + e]:
 * state k of element e of the parameters end to end; NULL: zeros, or not wanted) and
 * server s's shard whole in msg. */
static void shard_pack(const dmrt_ps_layout *L, int s, const float *params, const float *states, int64_t updates,
                       float *msg) {
    int64_t b, e, total = dmrt_ps_total(L);
    dmrt_ps_shard(L, s, &b, &e);
    memcpy(msg, &updates, sizeof updates);
    copy_range(L, b, e, (float *)params, 0, whole_part(msg, e - b, 0), 1);
    for (int k = 0; k < L->states; k++) {
        float *into = whole_part(msg, e - b, 1 + k);
        if (states) memcpy(into, states + k * total + b, (size_t)(e - b) * sizeof(float));
        else memset(into, 0, (size_t)(e - b) * sizeof(float));
    }
}

static int64_t shard_unpack(const dmrt_ps_layout *L, int s, const float *msg, float *params, float *states) {
    int64_t b, e, total = dmrt_ps_total(L), updates;
    dmrt_ps_shard(L, s, &b, &e);
    memcpy(&updates, msg, sizeof updates);
    copy_range(L, b, e, params, 0, whole_part(msg, e - b, 0), 0);
    for (int k = 0; states && k < L->states; k++)
        memcpy(states + k * total + b, whole_part(msg, e - b, 1 + k), (size_t)(e - b) * sizeof(float));
    return updates;
}

int dmrt_ps_start(dmrt_rank *r, const dmrt_ps_layout *L, const float *params, const float *states, int64_t updates) {
    if (dmrt_rank_id(r) != 0) return 0;
    float *buf = malloc((size_t)whole_floats(L, largest_shard(L)) * sizeof(float));
    if (!buf) return fail(r, "the parameters, to their server", "out of memory");
    int rc = 0;
    for (int s = 0; rc == 0 && s < L->servers; s++) {
        int64_t b, e;
        dmrt_ps_shard(L, s, &b, &e);
        shard_pack(L, s, params, states, updates, buf);
        if (dmrt_send_tagged(dmrt_rank_world(r), L->workers + s, TAG_INIT, buf, whole_floats(L, e - b),
                             "the parameters, to their server"))
            rc = DMRT_ERR_COMM;
    }
    free(buf);
    return rc;
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

int dmrt_ps_exchange(dmrt_rank *r, const dmrt_ps_layout *L, const float *grads, float *params, int64_t step, double lr) {
    float *buf = malloc((size_t)(HEADER + largest_shard(L)) * sizeof(float));
    if (!buf) return fail(r, "the gradients, to their server", "out of memory for a push");
    int rc = push(r, L, grads ? KIND_PUSH : KIND_SKIP, grads, step, lr, buf);
    if (rc == 0) rc = pull(r, L, params, buf);
    free(buf);
    return rc;
}

/* done (KIND_DONE), or done and the final parameters into params (KIND_FINAL) */
static int finish(dmrt_rank *r, const dmrt_ps_layout *L, int kind, float *params) {
    float *buf = malloc((size_t)(HEADER + largest_shard(L)) * sizeof(float));
    if (!buf) return fail(r, "done, to the servers", "out of memory");
    int rc = push(r, L, kind, NULL, 0, 0, buf);
    if (rc == 0 && kind == KIND_FINAL) rc = pull(r, L, params, buf);
    free(buf);
    return rc;
}

int dmrt_ps_finish(dmrt_rank *r, const dmrt_ps_layout *L) { return finish(r, L, KIND_DONE, NULL); }

int dmrt_ps_finish_pull(dmrt_rank *r, const dmrt_ps_layout *L, float *params) { return finish(r, L, KIND_FINAL, params); }

int dmrt_ps_snapshot(dmrt_rank *r, const dmrt_ps_layout *L, int64_t step, float *params, float *states, int64_t *updates) {
    int64_t most = largest_shard(L);
    float *buf = malloc((size_t)(HEADER + most + whole_floats(L, most)) * sizeof(float));
    if (!buf) return fail(r, "a snapshot, from the servers", "out of memory");
    int rc = push(r, L, KIND_SNAPSHOT, NULL, step, 0, buf);
    for (int s = 0; rc == 0 && s < L->servers; s++) {
        int64_t b, e;
        dmrt_ps_shard(L, s, &b, &e);
        rc = dmrt_recv_tagged(dmrt_rank_world(r), L->workers + s, TAG_SNAPSHOT, buf, whole_floats(L, e - b),
                              "a snapshot, from the servers");
        int64_t done = rc == 0 ? shard_unpack(L, s, buf, params, states) : 0;
        if (rc == 0 && s > 0 && done != *updates) {
            char why[160];
            dmrt_comm_format(why, sizeof why, "server 0 has made %lld updates and server %d %lld: they take every push",
                             (long long)*updates, s, (long long)done);
            rc = fail(r, "a snapshot, from the servers", why);
        }
        *updates = done;
    }
    free(buf);
    return rc;
}

/* ---- the server ----------------------------------------------------------------------- */

typedef struct server {
    dmrt_rank *r;
    const dmrt_ps_layout *L;
    dmrt_ps_step step;
    int64_t n;              /* the shard's elements */
    float *param, *sum;     /* (n) */
    float *state[2];        /* (n) each, the first L->states of them */
    int64_t updates;        /* of the shard: this run's and those of the checkpoint it started from */
    float *msg;             /* (HEADER + n) */
    float *whole;           /* (whole_floats(n)) the shard whole: worker 0's start, a snapshot */
    char *wants_final;      /* (workers) the worker said it is done with KIND_FINAL */
    dmrt_ps_stats *stats;
} server;

static void apply(server *sv, const float *grad, double lr) {
    sv->stats->updates++;
    sv->step.step = ++sv->updates;
    sv->step.lr = lr;
    sv->L->update(&sv->step, sv->param, grad, sv->state, sv->n);
}

static int receive_push(server *sv, int w, push_header *h) {
    double start = dmrt_comm_now();
    int rc = dmrt_recv_tagged(dmrt_rank_world(sv->r), w, TAG_PUSH, sv->msg, HEADER + sv->n, "a push, from its worker");
    sv->stats->waited_seconds += dmrt_comm_now() - start;
    if (rc) return rc;
    *h = header_read(sv->msg);
    if (h->kind != KIND_PUSH && h->kind != KIND_DONE && h->kind != KIND_SKIP && h->kind != KIND_FINAL &&
        h->kind != KIND_SNAPSHOT) {
        char why[128];
        dmrt_comm_format(why, sizeof why, "worker %d sent a push of unknown kind %d", w, h->kind);
        return fail(sv->r, "a push, from its worker", why);
    }
    if (h->kind == KIND_FINAL) sv->wants_final[w] = 1;
    if (h->kind == KIND_FINAL) h->kind = KIND_DONE; /* done either way; the final parameters are sent at the end */
    if (h->kind == KIND_PUSH || h->kind == KIND_SKIP) sv->stats->pushes++;
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

/* The shard whole (updates, parameters, state) to worker w. */
static int send_snapshot(server *sv, int w) {
    memcpy(sv->whole, &sv->updates, sizeof sv->updates);
    memcpy(whole_part(sv->whole, sv->n, 0), sv->param, (size_t)sv->n * sizeof(float));
    for (int k = 0; k < sv->L->states; k++)
        memcpy(whole_part(sv->whole, sv->n, 1 + k), sv->state[k], (size_t)sv->n * sizeof(float));
    return dmrt_send_tagged(dmrt_rank_world(sv->r), w, TAG_SNAPSHOT, sv->whole, whole_floats(sv->L, sv->n),
                            "a snapshot, to its worker");
}

/* Worker 0's start: the shard whole (a checkpoint's, or the parameters with zero state). */
static int receive_start(server *sv) {
    int rc = dmrt_recv_tagged(dmrt_rank_world(sv->r), 0, TAG_INIT, sv->whole, whole_floats(sv->L, sv->n),
                              "the parameters, from worker 0");
    if (rc) return rc;
    memcpy(&sv->updates, sv->whole, sizeof sv->updates);
    memcpy(sv->param, whole_part(sv->whole, sv->n, 0), (size_t)sv->n * sizeof(float));
    for (int k = 0; k < sv->L->states; k++)
        memcpy(sv->state[k], whole_part(sv->whole, sv->n, 1 + k), (size_t)sv->n * sizeof(float));
    return 0;
}

/* Every worker is done: the shard as it ends, to each that asked for it (asynchronous
 * servers apply pushes that come after a worker's last pull). */
static int send_final(server *sv) {
    int rc = 0;
    for (int w = 0; rc == 0 && w < sv->L->workers; w++)
        if (sv->wants_final[w]) rc = send_pull(sv, w);
    return rc;
}

static const char *kind_verb(int kind) {
    return kind == KIND_DONE ? "is done, after step" : kind == KIND_SNAPSHOT ? "asks for a snapshot after step" : "pushed step";
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
                                 kind_verb(first.kind), (long long)first.step, w, kind_verb(h.kind), (long long)h.step);
                return fail(sv->r, "a push, from its worker", why);
            }
            const float *g = sv->msg + HEADER;
            for (int64_t i = 0; h.kind == KIND_PUSH && i < sv->n; i++) sv->sum[i] += g[i];
        }
        if (first.kind == KIND_DONE) return send_final(sv);
        if (first.kind == KIND_SNAPSHOT) { /* the workers are between the same steps: the shard to each */
            for (int w = 0; w < L->workers; w++)
                if ((rc = send_snapshot(sv, w))) return rc;
            continue;
        }
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
    char *done = calloc((size_t)W, 1), *owed = calloc((size_t)W, 1), *snapshot = calloc((size_t)W, 1);
    if (!pushes || !done || !owed || !snapshot) rc = fail(sv->r, "a push, from its worker", "out of memory");
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
            if (h.kind == KIND_SNAPSHOT) { /* answered once every worker still training asks */
                snapshot[w] = 1;
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
        /* a snapshot holds every push made before it: each worker asking waits for it (it
         * pushes nothing more), and the others are to ask too (the workers take a checkpoint
         * after the same step) */
        int asking = 0, all = left > 0;
        for (int w = 0; w < W; w++) {
            asking |= snapshot[w];
            all &= done[w] || snapshot[w];
        }
        for (int w = 0; rc == 0 && asking && all && w < W; w++)
            if (snapshot[w]) {
                snapshot[w] = 0;
                rc = send_snapshot(sv, w);
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
    free(snapshot);
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
    sv.whole = malloc((size_t)whole_floats(L, sv.n) * sizeof(float));
    sv.wants_final = calloc((size_t)L->workers, 1);
    for (int k = 0; k < L->states; k++) sv.state[k] = calloc(1, bytes);
    int rc = 0;
    if (!sv.param || !sv.sum || !sv.msg || !sv.whole || !sv.wants_final || (L->states > 0 && !sv.state[0]) || (L->states > 1 && !sv.state[1]))
        rc = fail(r, "serving parameters", "out of memory for the shard");
    if (rc == 0) rc = receive_start(&sv);
    if (rc == 0) rc = L->staleness < 0 ? serve_synchronous(&sv) : serve_asynchronous(&sv);
    free(sv.param);
    free(sv.sum);
    free(sv.msg);
    free(sv.whole);
    free(sv.wants_final);
    free(sv.state[0]);
    free(sv.state[1]);
    return rc;
}
