/* trace.c: the timeline of a rank's pipeline actions, and its gathering to rank 0. */
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#define TRACE_MAX_EVENTS ((int64_t)1 << 20)

typedef struct comm_trace {
    dmrt_trace_event *events;   /* (n, capacity) */
    int64_t n, capacity;
} comm_trace;

int dmrt_trace_enable(dmrt_rank *r) {
    if (r->trace) return 0;
    r->trace = calloc(1, sizeof *r->trace);
    return r->trace ? 0 : DMRT_ERR_COMM;
}

void dmrt_comm_trace_free(dmrt_rank *r) {
    if (!r->trace) return;
    free(r->trace->events);
    free(r->trace);
    r->trace = NULL;
}

double dmrt_trace_now(const dmrt_rank *r) { return r && r->trace ? dmrt_comm_now() : 0; }

void dmrt_trace_action(dmrt_rank *r, char kind, int64_t micro, double start) {
    dmrt_trace_chunk_action(r, kind, micro, 0, start);
}

void dmrt_trace_chunk_action(dmrt_rank *r, char kind, int64_t micro, int chunk, double start) {
    if (!r || !r->trace) return;
    comm_trace *t = r->trace;
    if (t->n == t->capacity) {
        if (t->capacity >= TRACE_MAX_EVENTS) return;
        int64_t cap = t->capacity ? 2 * t->capacity : 1024;
        dmrt_trace_event *e = realloc(t->events, (size_t)cap * sizeof *e);
        if (!e) return; /* the timeline is a diagnostic: it loses events rather than fail the step */
        t->events = e, t->capacity = cap;
    }
    t->events[t->n++] = (dmrt_trace_event){.kind = kind, .chunk = chunk, .micro = micro, .step = r->step, .start = start, .end = dmrt_comm_now()};
}

int64_t dmrt_trace_events(const dmrt_rank *r, const dmrt_trace_event **events) {
    *events = r->trace ? r->trace->events : NULL;
    return r->trace ? r->trace->n : 0;
}

/* Events travel as floats holding their bytes: the collectives copy floats, never
 * convert them. */
#define EVENT_FLOATS ((int64_t)((sizeof(dmrt_trace_event) + sizeof(float) - 1) / sizeof(float)))

int dmrt_trace_gather(dmrt_rank *r, dmrt_trace_event **all, int64_t *counts) {
    *all = NULL;
    dmrt_comm *world = dmrt_rank_world(r);
    int size = dmrt_comm_size(world), me = dmrt_comm_rank(world);
    const dmrt_trace_event *mine;
    int64_t n = dmrt_trace_events(r, &mine);
    float *sizes = calloc((size_t)size, sizeof(float)), mine_n = (float)n;
    if (!sizes) return DMRT_ERR_COMM;
    if (dmrt_allgather(world, &mine_n, sizes, 1, "allgather of the trace's sizes")) {
        free(sizes);
        return DMRT_ERR_COMM;
    }
    int64_t most = 0;
    for (int i = 0; i < size; i++) {
        counts[i] = (int64_t)sizes[i];
        if (counts[i] > most) most = counts[i];
    }
    free(sizes);
    int64_t per_rank = most * EVENT_FLOATS;
    float *send = calloc((size_t)(per_rank ? per_rank : 1), sizeof(float));
    float *recv = calloc((size_t)(per_rank ? per_rank * size : 1), sizeof(float));
    if (!send || !recv) {
        free(send);
        free(recv);
        return DMRT_ERR_COMM;
    }
    if (n) memcpy(send, mine, (size_t)n * sizeof *mine);
    int status = dmrt_allgather(world, send, recv, per_rank, "allgather of the trace") ? DMRT_ERR_COMM : 0;
    free(send);
    if (status || me != 0) {
        free(recv);
        return status;
    }
    int64_t total = 0;
    for (int i = 0; i < size; i++) total += counts[i];
    dmrt_trace_event *out = malloc((size_t)(total ? total : 1) * sizeof *out);
    if (!out) {
        free(recv);
        return DMRT_ERR_COMM;
    }
    for (int i = 0, at = 0; i < size; at += (int)counts[i], i++)
        memcpy(out + at, recv + (int64_t)i * per_rank, (size_t)counts[i] * sizeof *out);
    free(recv);
    *all = out;
    return 0;
}
