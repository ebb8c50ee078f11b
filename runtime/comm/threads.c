/* threads.c: the threads backend of dmrt_comm, and dmrt_threads_run.
 *
 * N ranks are threads of one process. All ranks of a run share a tw_world; the ranks of
 * one communicator share a tw_group, found in the world's registry by the communicator's
 * creation number and member list (so the threads need not meet to create it).
 *
 * A collective is: publish a slot (op, count, root, buffer pointers), arrive at the
 * group's entry barrier, check that every member called the same thing, then work
 * directly on each other's buffers:
 *
 *   small (at most STAGE_FLOATS = 256 floats per rank to stage): each rank first copies
 *     its input into its own staging slot, and after the entry barrier every rank reads
 *     the staged copies. One barrier: slots and staging are double-buffered by call
 *     parity, and a rank can only reuse a parity after everyone has passed the next
 *     call's entry barrier, i.e. stopped reading.
 *   large: ranks read (and for allreduce write) each other's buffers in place; an exit
 *     barrier keeps every buffer alive until all are done. allreduce is a reduce-scatter
 *     then all-gather in shared memory: rank i sums slice i over all buffers, in rank
 *     order, and writes the sum into every buffer, so each byte is read and written once
 *     and the bandwidth scales with the ranks.
 *
 * Sums always run over comm ranks 0, 1, ... in order (dmrt_comm_sum_ordered), so results are
 * bit for bit the serial left-to-right sum, whichever path and whatever the timing.
 *
 * Barriers are generation counted: one 64-bit atomic holds (generation << 32 | arrived).
 * A waiter spins briefly (only when every rank can have a core), yields a few times, then
 * sleeps on a condition variable in slices of at most WAIT_SLICE_S, checking the
 * deadline, the world's abort flag and whether a rank it waits for has already returned.
 * A rank that gives up at the entry barrier withdraws its arrival (a CAS that fails if the
 * barrier completed in the meantime), so that no other rank proceeds to touch the buffers
 * of a rank that left. The exit barrier ignores aborts: every member is past the entry
 * barrier and only copies and adds before it arrives, so it comes promptly; it still has
 * a deadline, a whole timeout from its own arrival, against the impossible. A timeout
 * aborts the world, so the other ranks stop promptly. */
#include "comm_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Calls that move at most this many floats per rank are staged (measured on 2 cores:
 * beyond 1 KiB the large path's second barrier costs less than the staging copy). */
#define STAGE_FLOATS 256
/* Waiting: a few microseconds of polling (when every rank can have a core), then polls
 * with sched_yield, then sleep. Longer pure spinning measured worse on a loaded machine,
 * where the rank being waited for may need this very core. */
#define SPIN_POLLS 256
#define YIELD_POLLS 64
#define WAIT_SLICE_S 0.2      /* a sleeper re-checks abort/finish at least this often */
#define COPY_TILE 4096        /* floats summed and pushed per step of the large allreduce */

typedef struct tw_world tw_world;

/* What a member published for the current call. */
typedef struct tw_slot {
    comm_op op;
    int root;
    int64_t n;
    int64_t step;
    const float *send;  /* allgather, reduce-scatter, alltoall */
    float *buf;         /* allreduce and broadcast: the caller's buffer */
} tw_slot;

/* A buffered point-to-point message. */
typedef struct tw_msg {
    struct tw_msg *next;
    int64_t n, capacity;
    int64_t step;       /* the sender's step, for messages */
    int tag;            /* its channel (dmrt_send_tagged) */
    float data[];
} tw_msg;

/* Messages waiting for one member, a FIFO per sender. */
typedef struct tw_inbox {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    tw_msg **head, **tail;  /* (size) */
    tw_msg **spare;         /* (size) a received message kept for the sender to reuse */
} tw_inbox;

typedef struct tw_group {
    _Atomic uint64_t state;       /* generation << 32 | members arrived */
    tw_world *world;
    struct tw_group *next;        /* the world's registry; guarded by the world lock */
    uint64_t seq;
    int size;
    int refs;                     /* members holding it; guarded by the world lock */
    int *members;                 /* (size) world ranks */
    pthread_mutex_t lock;         /* guards sleepers; sleeping on released */
    pthread_cond_t released;
    int sleepers;
    _Atomic uint32_t *arrival;    /* (size) generation + 1 of member i's last arrival */
    tw_slot *slots;               /* (2, size) by call parity */
    float *stage;                 /* (2, size, STAGE_FLOATS) by call parity */
    tw_inbox *inbox;              /* (size) */
} tw_group;

struct tw_world {
    int n_ranks;
    int spin;                     /* spin before sleeping: every rank has a core */
    pthread_mutex_t lock;         /* guards groups and the fail message */
    tw_group *groups;
    _Atomic int failed_rank;      /* -1, or the first rank that aborted */
    char fail_message[COMM_ERROR_MAX];  /* set once, before failed_rank */
    _Atomic int *finished;        /* (n_ranks) 1 once rank_main returned */
    dmrt_rank *ranks;             /* (n_ranks) */
};

/* A rank's handle on a group. */
typedef struct tw_comm {
    tw_group *group;
    uint64_t calls;               /* collectives so far: parity selects slots and stage */
    const float **srcs;           /* (size) scratch for dmrt_comm_sum_ordered */
    int *flags;                   /* (2 * size) scratch for messages */
} tw_comm;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void cond_init_monotonic(pthread_cond_t *cv) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

/* Sleeps on cv until woken or until the monotonic time `until` (seconds). */
static void cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *m, double until) {
    struct timespec ts;
    double whole = (double)(int64_t)until;
    ts.tv_sec = (time_t)whole;
    ts.tv_nsec = (long)((until - whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    pthread_cond_timedwait(cv, m, &ts);
}

static uint32_t generation_of(uint64_t state) { return (uint32_t)(state >> 32); }

/* ---- failure state of the world ------------------------------------------------------ */

/* Wakes every sleeper of the world so that it re-checks the abort flag and the finished
 * ranks. Takes the world lock, then each group's locks (the only order ever used). */
static void wake_all(tw_world *w) {
    pthread_mutex_lock(&w->lock);
    for (tw_group *g = w->groups; g; g = g->next) {
        pthread_mutex_lock(&g->lock);
        pthread_cond_broadcast(&g->released);
        pthread_mutex_unlock(&g->lock);
        for (int i = 0; i < g->size; i++) {
            pthread_mutex_lock(&g->inbox[i].lock);
            pthread_cond_broadcast(&g->inbox[i].ready);
            pthread_mutex_unlock(&g->inbox[i].lock);
        }
    }
    pthread_mutex_unlock(&w->lock);
}

static void tw_abort(dmrt_rank *r, const char *message) {
    tw_world *w = r->impl;
    pthread_mutex_lock(&w->lock);
    if (atomic_load_explicit(&w->failed_rank, memory_order_relaxed) < 0) {
        dmrt_comm_format(w->fail_message, sizeof w->fail_message, "%s", message);
        atomic_store_explicit(&w->failed_rank, r->id, memory_order_release);
    }
    pthread_mutex_unlock(&w->lock);
    wake_all(w);
}

/* After a failure of its own (a timeout), r aborts the world with its error message,
 * keeping that message as its own error. */
static void abort_after_failure(dmrt_rank *r) {
    if (!dmrt_comm_claim_abort(r)) return;
    dmrt_comm_format(r->abort_message, sizeof r->abort_message, "%s", dmrt_comm_error_body(r));
    atomic_store(&r->failed, 1);
    tw_abort(r, r->abort_message);
}

/* Fails the call if another rank aborted the world. */
static int check_world(dmrt_comm *c, const comm_call *call) {
    tw_world *w = c->rank->impl;
    int failed = atomic_load_explicit(&w->failed_rank, memory_order_acquire);
    if (failed < 0) return 0;
    return dmrt_comm_fail(c, call, "rank %d failed: %s", failed, w->fail_message);
}

/* "rank 3" or "ranks 2, 3": the world ranks of the members whose flag is set; returns
 * how many. */
static int list_members(char *buf, size_t size, const tw_group *g, const int *flags) {
    int count = 0;
    for (int i = 0; i < g->size; i++) count += flags[i] != 0;
    buf[0] = 0;
    dmrt_comm_appendf(buf, size, "rank%s", count == 1 ? "" : "s");
    for (int i = 0, k = 0; i < g->size; i++)
        if (flags[i]) dmrt_comm_appendf(buf, size, "%s %d", k++ ? "," : "", g->members[i]);
    return count;
}

/* ---- barriers ------------------------------------------------------------------------ */

static void release(tw_group *g, uint32_t gen) {
    atomic_store_explicit(&g->state, (uint64_t)(uint32_t)(gen + 1) << 32, memory_order_release);
    pthread_mutex_lock(&g->lock);
    if (g->sleepers) pthread_cond_broadcast(&g->released);
    pthread_mutex_unlock(&g->lock);
}

/* Takes back this member's arrival at generation gen. Returns 1 if it did, 0 if the
 * barrier completed first (then the caller has passed it after all). */
static int withdraw(tw_group *g, uint32_t gen, int me) {
    uint64_t s = atomic_load_explicit(&g->state, memory_order_acquire);
    while (generation_of(s) == gen) {
        if (atomic_compare_exchange_weak_explicit(&g->state, &s, s - 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            atomic_store_explicit(&g->arrival[me], gen, memory_order_relaxed);
            return 1;
        }
    }
    return 0;
}

/* The two barriers of a collective (see the top of the file). */
typedef enum {
    AT_ENTRY,  /* gives up on an abort, a missing rank that returned, or the deadline */
    AT_EXIT,   /* every member is past the entry and only copying: gives up only if the
                * others take a whole timeout to finish (something is badly wrong) */
} barrier_kind;

/* Why a waiter at generation gen should give up, written into why (empty: keep going).
 * flags is scratch for 2 * size ints. */
static void reason_to_give_up(dmrt_comm *c, tw_group *g, uint32_t gen, barrier_kind kind,
                              double now, double deadline, int *flags, char *why,
                              size_t size) {
    tw_world *w = g->world;
    why[0] = 0;
    int failed = atomic_load_explicit(&w->failed_rank, memory_order_acquire);
    if (kind == AT_ENTRY && failed >= 0) {
        dmrt_comm_format(why, size, "rank %d failed: %s", failed, w->fail_message);
        return;
    }
    int *missing = flags, *gone = flags + g->size;
    int any_gone = 0;
    for (int i = 0; i < g->size; i++) {
        missing[i] = atomic_load_explicit(&g->arrival[i], memory_order_relaxed) != gen + 1;
        gone[i] = missing[i] &&
                  atomic_load_explicit(&w->finished[g->members[i]], memory_order_acquire);
        any_gone |= gone[i];
    }
    char who[256];
    if (kind == AT_ENTRY && any_gone) {
        int k = list_members(who, sizeof who, g, gone);
        dmrt_comm_format(why, size, "%s returned from %s main function without calling it", who,
                    k == 1 ? "its" : "their");
    } else if (now >= deadline) {
        list_members(who, sizeof who, g, missing);
        dmrt_comm_format(why, size, "timed out after %g s%s: %s did not %s", c->rank->timeout,
                    kind == AT_EXIT ? " at the end of the collective" : "", who,
                    kind == AT_EXIT ? "finish" : "arrive");
    }
}

/* Waits until generation gen is over. Returns 0, or gives up as `kind` says (at the
 * entry, withdrawing the arrival first) with DMRT_ERR_COMM and the message set; a
 * timeout also aborts the world. */
static int wait_release(dmrt_comm *c, tw_group *g, uint32_t gen, const comm_call *call,
                        barrier_kind kind) {
    /* Spinning only pays when the awaited ranks run on other cores; yielding also helps
     * when they wait for this core (more ranks than cores: 4x faster small collectives
     * with 4 ranks on 2 cores than sleeping at once). Both are bounded. */
    for (int i = 0; g->world->spin && i < SPIN_POLLS; i++) {
        if (generation_of(atomic_load_explicit(&g->state, memory_order_acquire)) != gen) return 0;
        cpu_relax();
    }
    for (int i = 0; i < YIELD_POLLS; i++) {
        if (generation_of(atomic_load_explicit(&g->state, memory_order_acquire)) != gen) return 0;
        sched_yield();
    }
    tw_comm *tc = c->impl;
    double deadline = kind == AT_ENTRY ? call->deadline : dmrt_comm_now() + c->rank->timeout;
    char why[COMM_ERROR_MAX];
    why[0] = 0;
    pthread_mutex_lock(&g->lock);
    g->sleepers++;
    while (generation_of(atomic_load_explicit(&g->state, memory_order_acquire)) == gen) {
        double now = dmrt_comm_now();
        reason_to_give_up(c, g, gen, kind, now, deadline, tc->flags, why, sizeof why);
        if (why[0]) {
            if (kind == AT_EXIT || withdraw(g, gen, c->me)) break;
            why[0] = 0;  /* the barrier completed after all */
            continue;
        }
        double until = now + WAIT_SLICE_S < deadline ? now + WAIT_SLICE_S : deadline;
        cond_wait_until(&g->released, &g->lock, until);
    }
    g->sleepers--;
    pthread_mutex_unlock(&g->lock);
    if (!why[0]) return 0;
    dmrt_comm_fail(c, call, "%s", why);
    if (strncmp(why, "timed out", 9) == 0) abort_after_failure(c->rank);
    return DMRT_ERR_COMM;
}

/* Arrives at the group's barrier and waits for the others (see wait_release). */
static int barrier_wait(dmrt_comm *c, tw_group *g, const comm_call *call, barrier_kind kind) {
    uint32_t gen = generation_of(atomic_load_explicit(&g->state, memory_order_acquire));
    atomic_store_explicit(&g->arrival[c->me], gen + 1, memory_order_relaxed);
    uint64_t before = atomic_fetch_add_explicit(&g->state, 1, memory_order_acq_rel);
    if ((uint32_t)before + 1 == (uint32_t)g->size) {
        release(g, gen);
        return 0;
    }
    return wait_release(c, g, gen, call, kind);
}

/* ---- the shape of every collective ---------------------------------------------------- */

static tw_slot *slot_of(tw_group *g, uint64_t call_no, int member) {
    return &g->slots[(call_no & 1) * (uint64_t)g->size + (uint64_t)member];
}

static float *stage_of(tw_group *g, uint64_t call_no, int member) {
    return g->stage + ((call_no & 1) * (uint64_t)g->size + (uint64_t)member) * STAGE_FLOATS;
}

static void describe_slot(char *buf, size_t size, const tw_slot *s) {
    buf[0] = 0;
    dmrt_comm_appendf(buf, size, "%s", dmrt_comm_op_name(s->op));
    if (s->op == COMM_OP_BROADCAST) dmrt_comm_appendf(buf, size, " from root %d", s->root);
    if (s->op != COMM_OP_BARRIER) {
        const char *per = s->op == COMM_OP_ALLREDUCE || s->op == COMM_OP_BROADCAST
                              ? "" : " per rank";
        dmrt_comm_appendf(buf, size, " of %lld floats%s", (long long)s->n, per);
    }
    if (s->step >= 0) dmrt_comm_appendf(buf, size, " at step %lld", (long long)s->step);
}

/* Publishes this member's slot for the call; returns the call number. */
static uint64_t publish(dmrt_comm *c, tw_comm *tc, comm_op op, int root, int64_t n,
                        const float *send, float *buf) {
    uint64_t call_no = tc->calls++;
    tw_slot *s = slot_of(tc->group, call_no, c->me);
    s->op = op;
    s->root = root;
    s->n = n;
    s->step = c->rank->step;
    s->send = send;
    s->buf = buf;
    return call_no;
}

/* The entry barrier, then the check that every member made the same call. */
static int enter(dmrt_comm *c, tw_comm *tc, uint64_t call_no, const comm_call *call) {
    tw_group *g = tc->group;
    if (barrier_wait(c, g, call, AT_ENTRY) != 0) return DMRT_ERR_COMM;
    const tw_slot *mine = slot_of(g, call_no, c->me);
    for (int i = 0; i < g->size; i++) {
        const tw_slot *s = slot_of(g, call_no, i);
        if (s->op != mine->op || s->n != mine->n || s->root != mine->root) {
            char a[160], b[160];
            describe_slot(a, sizeof a, mine);
            describe_slot(b, sizeof b, s);
            /* Every member sees the same slots, so all of them fail here, before any
             * touches another's buffers. */
            return dmrt_comm_fail(c, call, "ranks disagree on the collective: this rank called %s,"
                             " rank %d called %s", a, g->members[i], b);
        }
    }
    return 0;
}

/* The common start of every collective: the world check, the slot, the staging copy
 * (`stage_n` floats of `stage_src`, when the call is small) and the entry barrier. */
static int start(dmrt_comm *c, const comm_call *call, comm_op op, int root, int64_t n,
                 const float *send, float *buf, const float *stage_src, int64_t stage_n,
                 uint64_t *call_no) {
    tw_comm *tc = c->impl;
    if (check_world(c, call)) return DMRT_ERR_COMM;
    *call_no = publish(c, tc, op, root, n, send, buf);
    if (stage_src && stage_n > 0)
        memcpy(stage_of(tc->group, *call_no, c->me), stage_src, (size_t)stage_n * sizeof(float));
    return enter(c, tc, *call_no, call);
}

/* ---- collectives --------------------------------------------------------------------- */

static int tw_allreduce(dmrt_comm *c, float *buf, int64_t n, const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    int small = n <= STAGE_FLOATS;
    uint64_t k;
    if (start(c, call, COMM_OP_ALLREDUCE, 0, n, NULL, buf, small ? buf : NULL, n, &k))
        return DMRT_ERR_COMM;
    if (g->size == 1) return 0;  /* a mesh axis of size 1 */
    if (small) {
        for (int i = 0; i < g->size; i++) tc->srcs[i] = stage_of(g, k, i);
        dmrt_comm_sum_ordered(buf, tc->srcs, g->size, n);
        return 0;
    }
    /* Reduce my slice over everyone's buffer, then push the sum into every buffer. */
    int64_t lo, hi;
    dmrt_comm_slice(n, g->size, c->me, &lo, &hi);
    for (int64_t j = lo; j < hi; j += COPY_TILE) {
        int64_t t = hi - j < COPY_TILE ? hi - j : COPY_TILE;
        for (int i = 0; i < g->size; i++) tc->srcs[i] = slot_of(g, k, i)->buf + j;
        dmrt_comm_sum_ordered(buf + j, tc->srcs, g->size, t);
        for (int i = 0; i < g->size; i++)
            if (i != c->me) memcpy(slot_of(g, k, i)->buf + j, buf + j, (size_t)t * sizeof(float));
    }
    return barrier_wait(c, g, call, AT_EXIT);
}

static int tw_allgather(dmrt_comm *c, const float *send, float *recv, int64_t n,
                        const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    int small = n <= STAGE_FLOATS;
    uint64_t k;
    if (start(c, call, COMM_OP_ALLGATHER, 0, n, send, recv, small ? send : NULL, n, &k))
        return DMRT_ERR_COMM;
    for (int i = 0; i < g->size; i++) {
        float *dst = recv + (int64_t)i * n;
        const float *src = small ? stage_of(g, k, i) : slot_of(g, k, i)->send;
        if (i == c->me) src = send;
        if (src != dst && n > 0) memcpy(dst, src, (size_t)n * sizeof(float));
    }
    return small ? 0 : barrier_wait(c, g, call, AT_EXIT);
}

static int tw_reduce_scatter(dmrt_comm *c, const float *send, float *recv, int64_t n,
                             const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    int64_t total = n * g->size;
    int small = total <= STAGE_FLOATS;
    uint64_t k;
    if (start(c, call, COMM_OP_REDUCE_SCATTER, 0, n, send, recv, small ? send : NULL, total,
              &k))
        return DMRT_ERR_COMM;
    for (int i = 0; i < g->size; i++) {
        const float *src = small ? stage_of(g, k, i) : slot_of(g, k, i)->send;
        tc->srcs[i] = src + (int64_t)c->me * n;
    }
    dmrt_comm_sum_ordered(recv, tc->srcs, g->size, n);
    return small ? 0 : barrier_wait(c, g, call, AT_EXIT);
}

static int tw_alltoall(dmrt_comm *c, const float *send, float *recv, int64_t n,
                       const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    int64_t total = n * g->size;
    int small = total <= STAGE_FLOATS;
    uint64_t k;
    if (start(c, call, COMM_OP_ALLTOALL, 0, n, send, recv, small ? send : NULL, total, &k))
        return DMRT_ERR_COMM;
    for (int i = 0; i < g->size && n > 0; i++) {
        const float *src = small ? stage_of(g, k, i) : slot_of(g, k, i)->send;
        memcpy(recv + (int64_t)i * n, src + (int64_t)c->me * n, (size_t)n * sizeof(float));
    }
    return small ? 0 : barrier_wait(c, g, call, AT_EXIT);
}

static int tw_broadcast(dmrt_comm *c, int root, float *buf, int64_t n, const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    int small = n <= STAGE_FLOATS;
    int staging = small && c->me == root;
    uint64_t k;
    if (start(c, call, COMM_OP_BROADCAST, root, n, NULL, buf, staging ? buf : NULL, n, &k))
        return DMRT_ERR_COMM;
    if (c->me != root && n > 0) {
        const float *src = small ? stage_of(g, k, root) : slot_of(g, k, root)->buf;
        memcpy(buf, src, (size_t)n * sizeof(float));
    }
    return small ? 0 : barrier_wait(c, g, call, AT_EXIT);
}

static int tw_barrier(dmrt_comm *c, const comm_call *call) {
    uint64_t k;
    return start(c, call, COMM_OP_BARRIER, 0, 0, NULL, NULL, NULL, 0, &k);
}

/* ---- point to point ------------------------------------------------------------------- */

static int tw_send(dmrt_comm *c, int peer, const float *buf, int64_t n, const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    if (check_world(c, call)) return DMRT_ERR_COMM;
    tw_inbox *box = &g->inbox[peer];
    int me = c->me;
    pthread_mutex_lock(&box->lock);
    tw_msg *m = box->spare[me];
    if (m && m->capacity >= n) box->spare[me] = NULL;
    else m = NULL;
    pthread_mutex_unlock(&box->lock);
    if (!m) {
        m = malloc(sizeof *m + (size_t)n * sizeof(float));
        if (!m) return dmrt_comm_fail(c, call, "out of memory buffering %lld floats", (long long)n);
        m->capacity = n;
    }
    m->next = NULL;
    m->n = n;
    m->tag = call->tag;
    m->step = c->rank->step;
    if (n > 0) memcpy(m->data, buf, (size_t)n * sizeof(float));
    pthread_mutex_lock(&box->lock);
    if (box->tail[me]) box->tail[me]->next = m;
    else box->head[me] = m;
    box->tail[me] = m;
    pthread_cond_broadcast(&box->ready);
    pthread_mutex_unlock(&box->lock);
    return 0;
}

/* The link before the first message from peer on channel tag in box (box->head[peer]'s
 * address for the first), or NULL when none has come. Under box->lock. */
static tw_msg **first_on_channel(tw_inbox *box, int peer, int tag) {
    for (tw_msg **at = &box->head[peer]; *at; at = &(*at)->next)
        if ((*at)->tag == tag) return at;
    return NULL;
}

static int tw_probe(dmrt_comm *c, int peer, const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_inbox *box = &tc->group->inbox[c->me];
    if (check_world(c, call)) return DMRT_ERR_COMM;
    pthread_mutex_lock(&box->lock);
    int waiting = first_on_channel(box, peer, call->tag) != NULL;
    pthread_mutex_unlock(&box->lock);
    return waiting;
}

static int tw_recv(dmrt_comm *c, int peer, float *buf, int64_t n, const comm_call *call) {
    tw_comm *tc = c->impl;
    tw_group *g = tc->group;
    tw_world *w = g->world;
    if (check_world(c, call)) return DMRT_ERR_COMM;
    tw_inbox *box = &g->inbox[c->me];
    char why[COMM_ERROR_MAX];
    why[0] = 0;
    pthread_mutex_lock(&box->lock);
    tw_msg **link;
    while (!(link = first_on_channel(box, peer, call->tag))) {
        double now = dmrt_comm_now();
        int failed = atomic_load_explicit(&w->failed_rank, memory_order_acquire);
        if (failed >= 0) {
            dmrt_comm_format(why, sizeof why, "rank %d failed: %s", failed, w->fail_message);
        } else if (atomic_load_explicit(&w->finished[g->members[peer]], memory_order_acquire)) {
            dmrt_comm_format(why, sizeof why, "rank %d returned from its main function without sending",
                        g->members[peer]);
        } else if (now >= call->deadline) {
            dmrt_comm_format(why, sizeof why, "timed out after %g s: rank %d sent nothing",
                        c->rank->timeout, g->members[peer]);
        }
        if (why[0]) break;
        double until = now + WAIT_SLICE_S < call->deadline ? now + WAIT_SLICE_S : call->deadline;
        cond_wait_until(&box->ready, &box->lock, until);
    }
    tw_msg *m = link ? *link : NULL;
    if (m && !why[0]) {
        *link = m->next;
        /* the last one taken: the tail is the message before it, if any */
        if (box->tail[peer] == m)
            box->tail[peer] = link == &box->head[peer] ? NULL : (tw_msg *)((char *)link - offsetof(tw_msg, next));
    }
    pthread_mutex_unlock(&box->lock);
    if (why[0]) {
        dmrt_comm_fail(c, call, "%s", why);
        if (strncmp(why, "timed out", 9) == 0) abort_after_failure(c->rank);
        return DMRT_ERR_COMM;
    }
    int rc = 0;
    if (m->n != n) {
        char at[48] = "";
        if (m->step >= 0) dmrt_comm_format(at, sizeof at, " at step %lld", (long long)m->step);
        rc = dmrt_comm_fail(c, call, "rank %d sent %lld floats%s, this recv expects %lld",
                       g->members[peer], (long long)m->n, at, (long long)n);
    } else if (n > 0) {
        memcpy(buf, m->data, (size_t)n * sizeof(float));
    }
    pthread_mutex_lock(&box->lock);
    tw_msg *old = box->spare[peer];
    box->spare[peer] = m;
    pthread_mutex_unlock(&box->lock);
    free(old);
    return rc;
}

/* ---- groups ----------------------------------------------------------------------------- */

static void free_group(tw_group *g) {
    if (!g) return;
    if (g->inbox) {
        for (int i = 0; i < g->size; i++) {
            tw_inbox *box = &g->inbox[i];
            for (int s = 0; s < g->size; s++) {
                for (tw_msg *m = box->head ? box->head[s] : NULL, *next; m; m = next) {
                    next = m->next;
                    free(m);
                }
                if (box->spare) free(box->spare[s]);
            }
            free(box->head);
            free(box->tail);
            free(box->spare);
            pthread_mutex_destroy(&box->lock);
            pthread_cond_destroy(&box->ready);
        }
        free(g->inbox);
    }
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->released);
    free(g->members);
    free((void *)g->arrival);
    free(g->slots);
    free(g->stage);
    free(g);
}

static tw_group *new_group(tw_world *w, uint64_t seq, int size, const int *members) {
    tw_group *g;
    if (posix_memalign((void **)&g, 64, sizeof *g) != 0) return NULL;
    memset(g, 0, sizeof *g);
    atomic_init(&g->state, 0);
    g->world = w;
    g->seq = seq;
    g->size = size;
    pthread_mutex_init(&g->lock, NULL);
    cond_init_monotonic(&g->released);
    g->members = malloc(sizeof(int) * (size_t)size);
    g->arrival = calloc((size_t)size, sizeof *g->arrival);
    g->slots = calloc(2 * (size_t)size, sizeof *g->slots);
    g->stage = malloc(2 * (size_t)size * STAGE_FLOATS * sizeof(float));
    g->inbox = calloc((size_t)size, sizeof *g->inbox);
    if (!g->members || !g->arrival || !g->slots || !g->stage || !g->inbox) {
        free(g->inbox);
        g->inbox = NULL;
        free_group(g);
        return NULL;
    }
    memcpy(g->members, members, sizeof(int) * (size_t)size);
    for (int i = 0; i < size; i++) {
        tw_inbox *box = &g->inbox[i];
        pthread_mutex_init(&box->lock, NULL);
        cond_init_monotonic(&box->ready);
        box->head = calloc((size_t)size, sizeof *box->head);
        box->tail = calloc((size_t)size, sizeof *box->tail);
        box->spare = calloc((size_t)size, sizeof *box->spare);
        if (!box->head || !box->tail || !box->spare) {
            free_group(g);
            return NULL;
        }
    }
    return g;
}

static int tw_comm_create(dmrt_comm *c, uint64_t seq, const comm_call *call) {
    tw_world *w = c->rank->impl;
    tw_comm *tc = calloc(1, sizeof *tc);
    const float **srcs = calloc((size_t)c->size, sizeof *srcs);
    int *flags = calloc(2 * (size_t)c->size, sizeof *flags);
    if (!tc || !srcs || !flags) {
        free(tc);
        free(srcs);
        free(flags);
        return dmrt_comm_fail(c, call, "out of memory creating the communicator");
    }
    pthread_mutex_lock(&w->lock);
    tw_group *g = w->groups;
    while (g && !(g->seq == seq && g->size == c->size &&
                  memcmp(g->members, c->members, sizeof(int) * (size_t)c->size) == 0))
        g = g->next;
    if (!g) {
        g = new_group(w, seq, c->size, c->members);
        if (g) {
            g->next = w->groups;
            w->groups = g;
        }
    }
    if (g) g->refs++;
    pthread_mutex_unlock(&w->lock);
    if (!g) {
        free(tc);
        free(srcs);
        free(flags);
        return dmrt_comm_fail(c, call, "out of memory creating the communicator");
    }
    tc->group = g;
    tc->srcs = srcs;
    tc->flags = flags;
    c->impl = tc;
    return 0;
}

static void tw_comm_destroy(dmrt_comm *c) {
    tw_comm *tc = c->impl;
    if (!tc) return;
    tw_group *g = tc->group;
    tw_world *w = g->world;
    pthread_mutex_lock(&w->lock);
    int last = --g->refs == 0;
    if (last) {
        tw_group **p = &w->groups;
        while (*p != g) p = &(*p)->next;
        *p = g->next;
    }
    pthread_mutex_unlock(&w->lock);
    if (last) free_group(g);
    free(tc->srcs);
    free(tc->flags);
    free(tc);
    c->impl = NULL;
}

static const dmrt_comm_backend threads_backend = {
    .name = "threads",
    .concurrent_comms = 1,
    .comm_create = tw_comm_create,
    .comm_destroy = tw_comm_destroy,
    .allreduce_sum = tw_allreduce,
    .allgather = tw_allgather,
    .reduce_scatter_sum = tw_reduce_scatter,
    .alltoall = tw_alltoall,
    .broadcast = tw_broadcast,
    .barrier = tw_barrier,
    .send = tw_send,
    .recv = tw_recv,
    .probe = tw_probe,
    .comm_skip = NULL,
    .abort = tw_abort,
};

/* ---- the launcher ------------------------------------------------------------------------ */

typedef struct tw_thread {
    tw_world *world;
    dmrt_rank *rank;
    dmrt_rank_main rank_main;
    void *arg;
    int status;
    pthread_t thread;
    int started;
    int stuck;     /* still running RETURN_GRACE_S after the world failed: left to run */
} tw_thread;

static void *rank_thread(void *p) {
    tw_thread *t = p;
    dmrt_rank *r = t->rank;
    t->status = t->rank_main(r, t->arg);
    if (t->status != 0 && !r->failed) {
        char msg[COMM_ERROR_MAX];
        if (r->error[0]) dmrt_comm_format(msg, sizeof msg, "%s", dmrt_comm_error_body(r));
        else dmrt_comm_format(msg, sizeof msg, "its main function returned %d", t->status);
        dmrt_rank_abort(r, msg);
    }
    /* nothing the rank started may run on once it has returned (after a failure the
     * abort above makes its helpers' calls fail promptly) */
    dmrt_comm_rank_stop_helpers(r);
    atomic_store_explicit(&t->world->finished[r->id], 1, memory_order_release);
    wake_all(t->world);
    return NULL;
}

static void free_world(tw_world *w) {
    if (!w) return;
    for (int i = 0; w->ranks && i < w->n_ranks; i++) {
        dmrt_rank *r = &w->ranks[i];
        if (!r->backend) continue;
        dmrt_comm_rank_release(r);  /* the mesh comms */
        if (r->world.impl) tw_comm_destroy(&r->world);
    }
    free(w->ranks);
    free((void *)w->finished);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

static int launch_fail(char *err, size_t errlen, const char *fmt, ...) COMM_PRINTF(3, 4);
static int launch_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return DMRT_ERR_COMM;
}

/* The launcher's message: the first failure (by time), its status, and who else failed. */
/* A rank still running RETURN_GRACE_S after the world failed (its thread stuck outside
 * any call that could fail: a loop, a sleep) is left running, so that the failure is
 * reported within a deadline and this much more, not when (if ever) it returns. */
#define RETURN_GRACE_S 1.0

/* Worlds left to ranks that did not return, kept reachable: their threads may still use
 * them, and a leak checker should not count them. */
static struct abandoned {
    tw_world *world;
    tw_thread *threads;
    struct abandoned *next;
} *abandoned;
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

static int is_finished(const tw_world *w, int i) {
    return atomic_load_explicit(&w->finished[i], memory_order_acquire) != 0;
}

/* Waits for every started rank to return, or, once the world has failed, at most
 * RETURN_GRACE_S more. Returns how many did not return (0: all joined). */
static int join_ranks(tw_world *w, tw_thread *threads) {
    double failed_at = -1;
    for (;;) {
        int running = 0;
        for (int i = 0; i < w->n_ranks; i++) running += threads[i].started && !is_finished(w, i);
        if (running == 0) break;
        double now = dmrt_comm_now();
        if (failed_at < 0 && atomic_load_explicit(&w->failed_rank, memory_order_acquire) >= 0) failed_at = now;
        if (failed_at >= 0 && now - failed_at > RETURN_GRACE_S) {
            for (int i = 0; i < w->n_ranks; i++)
                if (threads[i].started && !is_finished(w, i)) {
                    pthread_detach(threads[i].thread);
                    threads[i].started = 0;
                    threads[i].stuck = 1;
                } else if (threads[i].started) {
                    pthread_join(threads[i].thread, NULL);
                    threads[i].started = 0;
                }
            return running;
        }
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    for (int i = 0; i < w->n_ranks; i++)
        if (threads[i].started) pthread_join(threads[i].thread, NULL);
    return 0;
}

static int summarize(tw_world *w, const tw_thread *threads, char *err, size_t errlen) {
    int first = atomic_load_explicit(&w->failed_rank, memory_order_acquire);
    if (first < 0 || threads[first].stuck || threads[first].status == 0) {
        first = -1;
        for (int i = 0; i < w->n_ranks && first < 0; i++)
            if (!threads[i].stuck && threads[i].status != 0) first = i;
    }
    int stuck = 0;
    for (int i = 0; i < w->n_ranks; i++) stuck += threads[i].stuck;
    if (first < 0 && !stuck) return 0;
    if (first < 0) {
        if (err && errlen) dmrt_comm_format(err, errlen, "ranks did not return");
        return DMRT_ERR_COMM;
    }
    const dmrt_rank *r = &w->ranks[first];
    char msg[2 * COMM_ERROR_MAX];
    dmrt_comm_format(msg, sizeof msg, "rank %d failed: %s (status %d)", first,
                r->failed ? r->abort_message : r->error[0] ? dmrt_comm_error_body(r) : "no message",
                threads[first].status);
    int others = 0;
    for (int i = 0; i < w->n_ranks; i++) others += i != first && threads[i].status != 0;
    for (int i = 0, k = 0; i < w->n_ranks; i++) {
        if (i == first || threads[i].stuck || threads[i].status == 0) continue;
        const char *lead = others > 1 ? "; also failed: ranks" : "; also failed: rank";
        dmrt_comm_appendf(msg, sizeof msg, "%s %d", k++ ? "," : lead, i);
    }
    for (int i = 0, k = 0; i < w->n_ranks; i++)
        if (threads[i].stuck)
            dmrt_comm_appendf(msg, sizeof msg, "%s %d", k++ ? "," : stuck > 1 ? "; still running, not waited for: ranks"
                                                                           : "; still running, not waited for: rank", i);
    if (err && errlen) dmrt_comm_format(err, errlen, "%s", msg);
    return threads[first].status;
}

int dmrt_threads_run(int n_ranks, dmrt_rank_main rank_main, void *arg, char *err,
                     size_t errlen) {
    if (err && errlen) err[0] = 0;
    if (n_ranks < 1 || n_ranks > 65536)
        return launch_fail(err, errlen, "dmrt_threads_run: %d ranks; 1 to 65536 are possible",
                           n_ranks);
    if (!rank_main) return launch_fail(err, errlen, "dmrt_threads_run: no rank_main");
    tw_world *w = calloc(1, sizeof *w);
    tw_thread *threads = calloc((size_t)n_ranks, sizeof *threads);
    if (!w || !threads) {
        free(w);
        free(threads);
        return launch_fail(err, errlen, "dmrt_threads_run: out of memory for %d ranks", n_ranks);
    }
    w->n_ranks = n_ranks;
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->failed_rank, -1);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    w->spin = cpus > 0 && n_ranks <= cpus;
    w->ranks = calloc((size_t)n_ranks, sizeof *w->ranks);
    w->finished = calloc((size_t)n_ranks, sizeof *w->finished);
    int rc = 0;
    if (!w->ranks || !w->finished)
        rc = launch_fail(err, errlen, "dmrt_threads_run: out of memory for %d ranks", n_ranks);
    for (int i = 0; i < n_ranks && rc == 0; i++) {
        dmrt_rank *r = &w->ranks[i];
        if (dmrt_comm_rank_init(r, i, n_ranks, &threads_backend, err, errlen) != 0) {
            rc = DMRT_ERR_COMM;
            break;
        }
        r->impl = w;
        comm_call call = {COMM_OP_BARRIER, "creating the world", 0, 0};
        if (tw_comm_create(&r->world, 0, &call) != 0)
            rc = launch_fail(err, errlen, "%s", r->error);
    }
    if (rc != 0) {
        free_world(w);
        free(threads);
        return rc;
    }
    for (int i = 0; i < n_ranks; i++) {
        tw_thread *t = &threads[i];
        *t = (tw_thread){.world = w, .rank = &w->ranks[i], .rank_main = rank_main, .arg = arg};
        if (pthread_create(&t->thread, NULL, rank_thread, t) != 0) {
            /* The ranks already running fail promptly instead of waiting for this one. */
            t->status = DMRT_ERR_COMM;
            dmrt_rank_abort(t->rank, "could not start its thread");
            for (int j = i; j < n_ranks; j++)
                atomic_store_explicit(&w->finished[j], 1, memory_order_release);
            wake_all(w);
            break;
        }
        t->started = 1;
    }
    int stuck = join_ranks(w, threads);
    rc = summarize(w, threads, err, errlen);
    if (stuck) {
        struct abandoned *a = malloc(sizeof *a);
        pthread_mutex_lock(&abandoned_lock);
        if (a) *a = (struct abandoned){w, threads, abandoned}, abandoned = a;
        pthread_mutex_unlock(&abandoned_lock);
        return rc ? rc : DMRT_ERR_COMM;
    }
    free_world(w);
    free(threads);
    return rc;
}
