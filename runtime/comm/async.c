/* async.c: collectives that overlap computation (dmrt_allreduce_start,
 * dmrt_allgather_start, dmrt_comm_wait).
 *
 * Where the backend lets a rank use two communicators from two threads at once (threads),
 * each communicator that gets a started call has a helper thread of its rank: it runs the
 * started calls one after another, in the order they were started, with the ordinary
 * blocking collective, so every rank of the communicator still makes the same calls in
 * the same order, and the deadline, abort and mismatch checks apply unchanged. The
 * caller goes on computing meanwhile. A blocking collective on the same communicator
 * first waits for the started ones (dmrt_comm_settle), which keeps the order of calls the
 * program wrote. Elsewhere (MPI, initialised MPI_THREAD_FUNNELED) a started call runs
 * at once and its status waits for dmrt_comm_wait. */
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASYNC_QUEUE 64 /* started calls not yet done, per communicator */

typedef struct async_job {
    const float *send;  /* allgather: this rank's block; NULL: an allreduce of buf */
    float *buf;
    int64_t n;          /* allreduce: floats of buf; allgather: floats per rank */
    const char *what;
} async_job;

struct comm_async {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;        /* a job was queued or finished, or stop was set */
    async_job jobs[ASYNC_QUEUE];   /* ring: job k is jobs[k % ASYNC_QUEUE] */
    uint64_t started, done;        /* jobs queued, jobs finished (guarded by lock) */
    int stop;
    int status;                    /* first failure since the last dmrt_comm_wait */
    char job_error[COMM_ERROR_MAX];   /* the helper's error messages go here */
    char first_error[COMM_ERROR_MAX]; /* the message of that first failure */
};

static void *helper(void *arg) {
    dmrt_comm *c = arg;
    comm_async *a = c->async;
    dmrt_comm_set_error_sink(a->job_error);
    pthread_mutex_lock(&a->lock);
    for (;;) {
        while (a->done == a->started && !a->stop) pthread_cond_wait(&a->changed, &a->lock);
        if (a->done == a->started) break; /* stopping, nothing left */
        async_job job = a->jobs[a->done % ASYNC_QUEUE];
        pthread_mutex_unlock(&a->lock);
        int status = job.send ? dmrt_comm_allgather_now(c, job.send, job.buf, job.n, job.what)
                              : dmrt_comm_allreduce_now(c, job.buf, job.n, job.what);
        pthread_mutex_lock(&a->lock);
        if (status && !a->status) {
            a->status = status;
            memcpy(a->first_error, a->job_error, sizeof a->first_error);
        }
        a->done++;
        pthread_cond_broadcast(&a->changed);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

static comm_async *async_of(dmrt_comm *c) {
    if (c->async) return c->async;
    comm_async *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->changed, NULL);
    c->async = a;
    if (pthread_create(&a->thread, NULL, helper, c) != 0) {
        pthread_cond_destroy(&a->changed);
        pthread_mutex_destroy(&a->lock);
        free(a);
        c->async = NULL;
    }
    return c->async;
}

/* Waits until c's helper has finished every started call (lock held). */
static void drain(comm_async *a) {
    while (a->done < a->started) pthread_cond_wait(&a->changed, &a->lock);
}

/* Queues job on c's helper, or runs it now where there is none (the backend cannot, or
 * no thread could be made). */
static int start(dmrt_comm *c, async_job job) {
    comm_async *a = c->rank->backend->concurrent_comms ? async_of(c) : NULL;
    if (!a) {
        int status = job.send ? dmrt_comm_allgather_now(c, job.send, job.buf, job.n, job.what)
                              : dmrt_comm_allreduce_now(c, job.buf, job.n, job.what);
        if (status && !c->started_status) c->started_status = status;
        return status;
    }
    pthread_mutex_lock(&a->lock);
    while (a->started - a->done == ASYNC_QUEUE) pthread_cond_wait(&a->changed, &a->lock);
    a->jobs[a->started % ASYNC_QUEUE] = job;
    a->started++;
    pthread_cond_broadcast(&a->changed);
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int dmrt_allreduce_start(dmrt_comm *c, float *buf, int64_t n, const char *what) {
    if (!c) return DMRT_ERR_COMM;
    return start(c, (async_job){.buf = buf, .n = n, .what = what});
}

int dmrt_allgather_start(dmrt_comm *c, const float *send, float *recv, int64_t n_per_rank,
                         const char *what) {
    if (!c) return DMRT_ERR_COMM;
    if (!send) return dmrt_allgather(c, send, recv, n_per_rank, what); /* its error message */
    return start(c, (async_job){.send = send, .buf = recv, .n = n_per_rank, .what = what});
}

int dmrt_comm_wait(dmrt_comm *c) {
    if (!c) return DMRT_ERR_COMM;
    int status = c->started_status;
    c->started_status = 0;
    comm_async *a = c->async;
    if (a) {
        pthread_mutex_lock(&a->lock);
        drain(a);
        if (!status && a->status) {
            status = a->status;
            /* the helper's message becomes the rank's, written by the rank's thread */
            memcpy(c->rank->error, a->first_error, sizeof a->first_error);
        }
        a->status = 0;
        pthread_mutex_unlock(&a->lock);
    }
    return status;
}

void dmrt_comm_settle(dmrt_comm *c) {
    comm_async *a = c->async;
    if (!a) return;
    pthread_mutex_lock(&a->lock);
    drain(a);
    pthread_mutex_unlock(&a->lock);
}

void dmrt_comm_async_stop(dmrt_comm *c) {
    comm_async *a = c->async;
    if (!a) return;
    pthread_mutex_lock(&a->lock);
    a->stop = 1;
    pthread_cond_broadcast(&a->changed);
    pthread_mutex_unlock(&a->lock);
    pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->changed);
    pthread_mutex_destroy(&a->lock);
    free(a);
    c->async = NULL;
}
