/* comm_cases.c: see comm_cases.h. */
#include "comm_cases.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int case_fail(const dmrt_rank *r, const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    fprintf(stderr, "FAIL %s:%d: rank %d: %s\n", base ? base + 1 : file, line,
            r ? dmrt_rank_id(r) : -1, msg);
    return 1;
}

/* splitmix64 of (seed, rank, i). */
static uint64_t mix(uint32_t seed, int rank, int64_t i) {
    uint64_t z = ((uint64_t)seed << 40) ^ ((uint64_t)(uint32_t)rank << 20) ^ (uint64_t)i;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float case_value(uint32_t seed, int rank, int64_t i) {
    uint64_t h = mix(seed, rank, i);
    int mantissa = (int)(h % 2001) - 1000;
    int exponent = (int)((h >> 16) % 25) - 22;  /* |value| in [2^-22, 1000 * 2^2] */
    return ldexpf((float)mantissa, exponent);
}

void case_fill(float *p, int64_t n, uint32_t seed, int rank) {
    for (int64_t i = 0; i < n; i++) p[i] = case_value(seed, rank, i);
}

int case_same(const dmrt_rank *r, const char *what, const float *got, const float *want,
              int64_t n) {
    if (n == 0 || memcmp(got, want, (size_t)n * sizeof(float)) == 0) return 1;
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            case_fail(r, __FILE__, __LINE__, "%s: element %lld of %lld is %.9g, expected %.9g",
                      what, (long long)i, (long long)n, got[i], want[i]);
            break;
        }
    }
    return 0;
}

double case_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void case_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int case_has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

static float *alloc_floats(int64_t n) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory for %lld floats\n", (long long)n);
        abort();
    }
    return p;
}

/* Poison for receive buffers: a NaN pattern that no result equals bitwise. */
static void poison(float *p, int64_t n) { memset(p, 0xff, (size_t)n * sizeof(float)); }

int case_collectives(dmrt_comm *c, uint32_t seed, int64_t n) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    int me_world = dmrt_comm_member(c, me);
    int fails = 0;
    char what[160];
    int64_t total = n * size;
    float *in = alloc_floats(total), *got = alloc_floats(total), *want = alloc_floats(total);
    float *other = alloc_floats(total);

    /* allreduce: the serial left-to-right sum over comm ranks. */
    case_fill(got, n, seed, me_world);
    case_fill(want, n, seed, dmrt_comm_member(c, 0));
    for (int k = 1; k < size; k++) {
        case_fill(other, n, seed, dmrt_comm_member(c, k));
        for (int64_t i = 0; i < n; i++) want[i] += other[i];
    }
    snprintf(what, sizeof what, "allreduce of %lld on %s", (long long)n, dmrt_comm_axis_name(c));
    fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, got, n, what) == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, n);

    /* allgather, then in place. */
    case_fill(in, n, seed + 1, me_world);
    for (int k = 0; k < size; k++) case_fill(want + k * n, n, seed + 1, dmrt_comm_member(c, k));
    poison(got, total);
    snprintf(what, sizeof what, "allgather of %lld on %s", (long long)n, dmrt_comm_axis_name(c));
    fails += CASE_EXPECT(r, dmrt_allgather(c, in, got, n, what) == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, total);
    poison(got, total);
    memcpy(got + me * n, in, (size_t)n * sizeof(float));
    fails += CASE_EXPECT(r, dmrt_allgather(c, got + me * n, got, n, what) == 0, "%s",
                         dmrt_rank_error(r));
    fails += !case_same(r, "in-place allgather", got, want, total);

    /* reduce-scatter: block `me` of every rank's send, summed in rank order. */
    case_fill(in, total, seed + 2, me_world);
    {
        float *blocks = alloc_floats(total);
        case_fill(blocks, total, seed + 2, dmrt_comm_member(c, 0));
        memcpy(want, blocks + me * n, (size_t)n * sizeof(float));
        for (int k = 1; k < size; k++) {
            case_fill(blocks, total, seed + 2, dmrt_comm_member(c, k));
            for (int64_t i = 0; i < n; i++) want[i] += blocks[me * n + i];
        }
        free(blocks);
    }
    poison(got, n);
    snprintf(what, sizeof what, "reduce-scatter of %lld on %s", (long long)n,
             dmrt_comm_axis_name(c));
    fails += CASE_EXPECT(r, dmrt_reduce_scatter_sum(c, in, got, n, what) == 0, "%s",
                         dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, n);

    /* alltoall: block k of the result is block `me` of rank k's send. */
    case_fill(in, total, seed + 3, me_world);
    for (int k = 0; k < size; k++) {
        case_fill(other, total, seed + 3, dmrt_comm_member(c, k));
        memcpy(want + k * n, other + me * n, (size_t)n * sizeof(float));
    }
    poison(got, total);
    snprintf(what, sizeof what, "alltoall of %lld on %s", (long long)n, dmrt_comm_axis_name(c));
    fails += CASE_EXPECT(r, dmrt_alltoall(c, in, got, n, what) == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, what, got, want, total);

    /* broadcast from the first and the last rank. */
    for (int root = 0; root < size; root += size > 1 ? size - 1 : 1) {
        case_fill(got, n, seed + 4 + (uint32_t)root, me_world);
        case_fill(want, n, seed + 4 + (uint32_t)root, dmrt_comm_member(c, root));
        snprintf(what, sizeof what, "broadcast of %lld from %d on %s", (long long)n, root,
                 dmrt_comm_axis_name(c));
        fails += CASE_EXPECT(r, dmrt_broadcast(c, root, got, n, what) == 0, "%s",
                             dmrt_rank_error(r));
        fails += !case_same(r, what, got, want, n);
    }

    fails += CASE_EXPECT(r, dmrt_barrier(c, "barrier") == 0, "%s", dmrt_rank_error(r));
    free(in);
    free(got);
    free(want);
    free(other);
    return fails;
}

int case_collectives_all_sizes(dmrt_comm *c, uint32_t seed) {
    /* 256 floats is the threads backend's staging limit per rank (n, or size * n for
     * reduce-scatter and alltoall), 2048 the MPI backend's small allreduce. */
    static const int64_t sizes[] = {0, 1, 2, 3, 7, 16, 17, 64, 65, 100, 255, 256, 257, 1000,
                                    2048, 2049, 4097, 16385, 100003, 1 << 18};
    int fails = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && fails == 0; i++)
        fails += case_collectives(c, seed + 16 * (uint32_t)i, sizes[i]);
    return fails;
}

int case_mesh(dmrt_rank *r, int n_axes, const char *const *names, const int64_t *sizes) {
    int fails = 0;
    char err[512];
    int id = dmrt_rank_id(r);
    if (dmrt_mesh_init(r, n_axes, names, sizes, err, sizeof err) != 0)
        return case_fail(r, __FILE__, __LINE__, "dmrt_mesh_init: %s", err);
    fails += CASE_EXPECT(r, dmrt_mesh_axes(r) == n_axes, "%d axes", dmrt_mesh_axes(r));
    int coords[DMRT_MESH_MAX_AXES], stride[DMRT_MESH_MAX_AXES];
    for (int a = n_axes - 1, s = 1, rest = id; a >= 0; a--) {
        coords[a] = rest % (int)sizes[a];
        rest /= (int)sizes[a];
        stride[a] = s;
        s *= (int)sizes[a];
    }
    for (int a = 0; a < n_axes; a++) {
        dmrt_comm *c = dmrt_mesh_axis(r, a);
        fails += CASE_EXPECT(r, c != NULL, "no comm for axis %d", a);
        if (!c) continue;
        fails += CASE_EXPECT(r, dmrt_mesh_coord(r, a) == coords[a], "axis %s: coordinate %d, expected %d",
                             names[a], dmrt_mesh_coord(r, a), coords[a]);
        fails += CASE_EXPECT(r, dmrt_mesh_find_axis(r, names[a]) == a, "find_axis(%s)", names[a]);
        fails += CASE_EXPECT(r, strcmp(dmrt_comm_axis_name(c), names[a]) == 0, "axis name %s",
                             dmrt_comm_axis_name(c));
        fails += CASE_EXPECT(r, dmrt_comm_size(c) == sizes[a], "axis %s: size %d", names[a],
                             dmrt_comm_size(c));
        fails += CASE_EXPECT(r, dmrt_comm_rank(c) == coords[a], "axis %s: comm rank %d, expected %d",
                             names[a], dmrt_comm_rank(c), coords[a]);
        for (int i = 0; i < dmrt_comm_size(c); i++) {
            int want = id + (i - coords[a]) * stride[a];
            fails += CASE_EXPECT(r, dmrt_comm_member(c, i) == want,
                                 "axis %s: member %d is rank %d, expected %d", names[a], i,
                                 dmrt_comm_member(c, i), want);
        }
    }
    fails += CASE_EXPECT(r, dmrt_mesh_axis(r, n_axes) == NULL && dmrt_mesh_axis(r, -1) == NULL,
                         "axis out of range gave a comm");
    fails += CASE_EXPECT(r, dmrt_mesh_find_axis(r, "nope") == -1, "found axis 'nope'");
    if (fails) return fails;

    /* Each rank's value is its world rank times 1000 plus its coordinates: the sum along
     * an axis tells exactly which ranks were grouped. */
    for (int a = 0; a < n_axes; a++) {
        dmrt_comm *c = dmrt_mesh_axis(r, a);
        float v = (float)id;
        fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, &v, 1, "sum of world ranks") == 0, "%s",
                             dmrt_rank_error(r));
        float want = 0;
        for (int i = 0; i < sizes[a]; i++) want += (float)(id + (i - coords[a]) * stride[a]);
        fails += CASE_EXPECT(r, v == want, "axis %s: sum of world ranks %g, expected %g",
                             names[a], v, want);
        fails += case_collectives(c, 1000 + 10 * (uint32_t)a, 37);
        fails += case_collectives(c, 2000 + 10 * (uint32_t)a, 40000);
    }
    /* Interleaved use of the axes. */
    for (int it = 0; it < 20 && !fails; it++) {
        for (int a = 0; a < n_axes; a++) {
            float x[5];
            case_fill(x, 5, 77 + (uint32_t)it, id);
            fails += CASE_EXPECT(r, dmrt_allreduce_sum(dmrt_mesh_axis(r, a), x, 5, "interleaved") == 0,
                                 "%s", dmrt_rank_error(r));
        }
    }
    return fails;
}

int case_outside(dmrt_rank *r) {
    int n = dmrt_rank_count(r), id = dmrt_rank_id(r), fails = 0;
    const char *names[] = {"data"};
    const int64_t sizes[] = {n - 1}, wrong[] = {n};
    char err[512], want[160];
    fails += CASE_EXPECT(r, dmrt_mesh_init_outside(r, 1, names, wrong, 1, err, sizeof err) == DMRT_ERR_COMM,
                         "a mesh of %d and 1 outside accepted on %d ranks", n, n);
    snprintf(want, sizeof want, "mesh data=%d and 1 rank outside it need %d ranks, the run has %d", n, n + 1, n);
    fails += CASE_EXPECT(r, case_has(err, want), "got '%s', expected '%s'", err, want);
    if (dmrt_mesh_init_outside(r, 1, names, sizes, 1, err, sizeof err) != 0)
        return fails + case_fail(r, __FILE__, __LINE__, "mesh with a rank outside: %s", err);
    int outside = id == n - 1;
    fails += CASE_EXPECT(r, dmrt_mesh_inside(r) == !outside, "inside %d", dmrt_mesh_inside(r));
    fails += CASE_EXPECT(r, dmrt_mesh_axes(r) == (outside ? 0 : 1), "%d axes", dmrt_mesh_axes(r));
    dmrt_comm *w = dmrt_rank_world(r);
    if (!outside) {
        dmrt_comm *data = dmrt_mesh_axis(r, 0);
        fails += CASE_EXPECT(r, data && dmrt_comm_size(data) == n - 1, "data comm of %d", data ? dmrt_comm_size(data) : -1);
        if (data) fails += case_collectives(data, 77, 1000);
    }
    float go = 1, msg[3] = {1, 2, 3}, got[3] = {0, 0, 0};
    if (outside) {
        fails += CASE_EXPECT(r, dmrt_probe_tagged(w, 0, 9, "probe") == 0, "a message before any was sent");
        fails += CASE_EXPECT(r, dmrt_send(w, 0, &go, 1, "go") == 0, "%s", dmrt_rank_error(r));
        int waiting = 0;
        for (double until = case_now() + 30; !waiting && case_now() < until;) {
            waiting = dmrt_probe_tagged(w, 0, 9, "probe");
            if (!waiting) case_sleep(1e-4);
        }
        fails += CASE_EXPECT(r, waiting == 1, "probe gave %d: %s", waiting, dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_probe_tagged(w, 0, 8, "probe") == 0, "a message on a channel nobody sent on");
        fails += CASE_EXPECT(r, dmrt_recv_tagged(w, 0, 9, got, 3, "recv") == 0 && got[0] == 1 && got[2] == 3, "%s",
                             dmrt_rank_error(r));
    } else if (id == 0) {
        fails += CASE_EXPECT(r, dmrt_recv(w, n - 1, &go, 1, "go") == 0, "%s", dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_send_tagged(w, n - 1, 9, msg, 3, "tagged") == 0, "%s", dmrt_rank_error(r));
    }
    fails += CASE_EXPECT(r, dmrt_barrier(w, "after the outside case") == 0, "%s", dmrt_rank_error(r));
    return fails;
}

int case_p2p(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    int right = (me + 1) % size, left = (me + size - 1) % size;
    int fails = 0;
    static const int64_t sizes[] = {0, 1, 17, 5000, 1 << 20};
    int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    float *got = alloc_floats(sizes[n_sizes - 1]), *want = alloc_floats(sizes[n_sizes - 1]);
    float *out = alloc_floats(sizes[n_sizes - 1]);
    /* Everyone sends every size to both neighbours first, then receives: both sides of
     * each pair send first, and several messages queue up in order. */
    for (int s = 0; s < n_sizes; s++) {
        case_fill(out, sizes[s], seed + (uint32_t)s, dmrt_comm_member(c, me));
        fails += CASE_EXPECT(r, dmrt_send(c, right, out, sizes[s], "send right") == 0, "%s",
                             dmrt_rank_error(r));
        case_fill(out, sizes[s], seed + 100 + (uint32_t)s, dmrt_comm_member(c, me));
        fails += CASE_EXPECT(r, dmrt_send(c, left, out, sizes[s], "send left") == 0, "%s",
                             dmrt_rank_error(r));
    }
    for (int s = 0; s < n_sizes; s++) {
        /* From the left neighbour: what it sent right; from the right: what it sent left.
         * With 2 ranks both are the same peer, whose messages alternate. */
        int from[2] = {left, right};
        uint32_t seeds[2] = {seed + (uint32_t)s, seed + 100 + (uint32_t)s};
        if (size <= 2) from[0] = from[1] = right;  /* one peer: "right" then "left" */
        for (int k = 0; k < 2; k++) {
            poison(got, sizes[s]);
            fails += CASE_EXPECT(r, dmrt_recv(c, from[k], got, sizes[s], "recv") == 0, "%s",
                                 dmrt_rank_error(r));
            case_fill(want, sizes[s], seeds[k], dmrt_comm_member(c, from[k]));
            fails += !case_same(r, "p2p message", got, want, sizes[s]);
        }
    }
    /* Channels: messages to the right on channels 3, 1, 3, 0 (a large one, in pieces on
     * MPI), taken from the left in another order: 1, the first of 3, 0, the second of 3;
     * each channel keeps its own order. */
    static const int tags[] = {3, 1, 3, 0}, taken[] = {1, 0, 3, 2};
    static const int64_t tag_sizes[] = {5, 17, 1 << 20, 3};
    for (int k = 0; k < 4; k++) {
        case_fill(out, tag_sizes[k], seed + 300 + (uint32_t)k, dmrt_comm_member(c, me));
        fails += CASE_EXPECT(r, dmrt_send_tagged(c, right, tags[k], out, tag_sizes[k], "tagged") == 0, "%s",
                             dmrt_rank_error(r));
    }
    for (int q = 0; q < 4; q++) {
        int k = taken[q];
        poison(got, tag_sizes[k]);
        fails += CASE_EXPECT(r, dmrt_recv_tagged(c, left, tags[k], got, tag_sizes[k], "tagged") == 0, "%s",
                             dmrt_rank_error(r));
        case_fill(want, tag_sizes[k], seed + 300 + (uint32_t)k, dmrt_comm_member(c, left));
        fails += !case_same(r, "message on a channel", got, want, tag_sizes[k]);
    }
    fails += CASE_EXPECT(r, dmrt_send_tagged(c, right, DMRT_MAX_TAG + 1, out, 1, "bad channel") == DMRT_ERR_COMM,
                         "channel %d accepted", DMRT_MAX_TAG + 1);
    /* To itself. */
    case_fill(out, 33, seed + 7, 999);
    fails += CASE_EXPECT(r, dmrt_send(c, me, out, 33, "self") == 0, "%s", dmrt_rank_error(r));
    fails += CASE_EXPECT(r, dmrt_recv(c, me, got, 33, "self") == 0, "%s", dmrt_rank_error(r));
    fails += !case_same(r, "message to itself", got, out, 33);
    free(got);
    free(want);
    free(out);
    return fails;
}

int case_back_to_back(dmrt_comm *c, int iters) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int size = dmrt_comm_size(c), me = dmrt_comm_rank(c);
    /* Small sizes mostly (generations and parities turn over fast), some large ones. */
    static const int64_t sizes[] = {1, 3, 64, 257, 16, 20000, 0, 5};
    int n_sizes = (int)(sizeof sizes / sizeof sizes[0]);
    int64_t max_total = 20000 * (int64_t)size;
    float *buf = alloc_floats(max_total), *got = alloc_floats(max_total);
    int fails = 0;
    for (int it = 0; it < iters && fails == 0; it++) {
        int64_t n = sizes[(it * 5 + it / n_sizes) % n_sizes];
        /* Integer-valued inputs: every sum is exact, so the expected value is a formula. */
        int op = it % 5;
        float base = (float)(it % 97);
        switch (op) {
        case 0:  /* allreduce: sum over k of (base + k + i % 3) */
            for (int64_t i = 0; i < n; i++) buf[i] = base + (float)me + (float)(i % 3);
            fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, buf, n, "b2b allreduce") == 0, "it %d: %s",
                                 it, dmrt_rank_error(r));
            for (int64_t i = 0; i < n && !fails; i++) {
                float want = (float)size * (base + (float)(i % 3)) + (float)(size * (size - 1) / 2);
                fails += CASE_EXPECT(r, buf[i] == want, "it %d allreduce[%lld] = %g, expected %g",
                                     it, (long long)i, buf[i], want);
            }
            break;
        case 1:  /* allgather */
            for (int64_t i = 0; i < n; i++) buf[i] = base + (float)me;
            fails += CASE_EXPECT(r, dmrt_allgather(c, buf, got, n, "b2b allgather") == 0, "it %d: %s",
                                 it, dmrt_rank_error(r));
            for (int64_t i = 0; i < n * size && !fails; i++)
                fails += CASE_EXPECT(r, got[i] == base + (float)(i / n), "it %d allgather[%lld] = %g",
                                     it, (long long)i, got[i]);
            break;
        case 2:  /* reduce-scatter: block j of rank k holds base + k + j */
            for (int64_t i = 0; i < n * size; i++) buf[i] = base + (float)me + (float)(i / n);
            fails += CASE_EXPECT(r, dmrt_reduce_scatter_sum(c, buf, got, n, "b2b reduce-scatter") == 0,
                                 "it %d: %s", it, dmrt_rank_error(r));
            for (int64_t i = 0; i < n && !fails; i++) {
                float want = (float)size * (base + (float)me) + (float)(size * (size - 1) / 2);
                fails += CASE_EXPECT(r, got[i] == want, "it %d reduce-scatter[%lld] = %g, expected %g",
                                     it, (long long)i, got[i], want);
            }
            break;
        case 3:  /* alltoall: block j of rank k holds 100 k + j */
            for (int64_t i = 0; i < n * size; i++) buf[i] = (float)(100 * me) + (float)(i / n);
            fails += CASE_EXPECT(r, dmrt_alltoall(c, buf, got, n, "b2b alltoall") == 0, "it %d: %s",
                                 it, dmrt_rank_error(r));
            for (int64_t i = 0; i < n * size && !fails; i++) {
                float want = (float)(100 * (i / n)) + (float)me;
                fails += CASE_EXPECT(r, got[i] == want, "it %d alltoall[%lld] = %g, expected %g", it,
                                     (long long)i, got[i], want);
            }
            break;
        default: {  /* broadcast from a rotating root */
            int root = it % size;
            for (int64_t i = 0; i < n; i++) buf[i] = base + (float)me;
            fails += CASE_EXPECT(r, dmrt_broadcast(c, root, buf, n, "b2b broadcast") == 0, "it %d: %s",
                                 it, dmrt_rank_error(r));
            for (int64_t i = 0; i < n && !fails; i++)
                fails += CASE_EXPECT(r, buf[i] == base + (float)root, "it %d broadcast[%lld] = %g",
                                     it, (long long)i, buf[i]);
        }
        }
    }
    free(buf);
    free(got);
    return fails;
}

/* The serial sum over c's ranks of case_fill(n, seed, rank). */
static void expected_sum(dmrt_comm *c, float *want, float *scratch, int64_t n, uint32_t seed) {
    case_fill(want, n, seed, dmrt_comm_member(c, 0));
    for (int k = 1; k < dmrt_comm_size(c); k++) {
        case_fill(scratch, n, seed, dmrt_comm_member(c, k));
        for (int64_t i = 0; i < n; i++) want[i] += scratch[i];
    }
}

int case_started(dmrt_comm *c, uint32_t seed) {
    dmrt_rank *r = dmrt_comm_owner(c);
    int me_world = dmrt_comm_member(c, dmrt_comm_rank(c));
    /* small and large (both paths of the threads backend), more than fit at once in the
     * helper's queue would be too few to matter: 6 buffers, started back to back */
    static const int64_t sizes[] = {1, 100, 5000, 70001, 3, 300000};
    enum { N_BUF = sizeof sizes / sizeof sizes[0] };
    float *bufs[N_BUF], *want = alloc_floats(300000), *scratch = alloc_floats(300000);
    int fails = 0;
    for (int round = 0; round < 3; round++) {
        for (int b = 0; b < N_BUF; b++) {
            bufs[b] = alloc_floats(sizes[b]);
            case_fill(bufs[b], sizes[b], seed + (uint32_t)(round * N_BUF + b), me_world);
            fails += CASE_EXPECT(r, dmrt_allreduce_start(c, bufs[b], sizes[b], "started allreduce") == 0, "%s",
                                 dmrt_rank_error(r));
            if (b == 2 && round == 1) {
                /* a blocking call on the same comm waits for the started ones: the order holds */
                float x = 1.0f;
                fails += CASE_EXPECT(r, dmrt_allreduce_sum(c, &x, 1, "blocking in between") == 0, "%s",
                                     dmrt_rank_error(r));
                fails += CASE_EXPECT(r, x == (float)dmrt_comm_size(c), "blocking sum %g", (double)x);
            }
        }
        /* computation meanwhile: the expected results */
        fails += CASE_EXPECT(r, dmrt_comm_wait(c) == 0, "%s", dmrt_rank_error(r));
        for (int b = 0; b < N_BUF; b++) {
            expected_sum(c, want, scratch, sizes[b], seed + (uint32_t)(round * N_BUF + b));
            fails += !case_same(r, "started allreduce", bufs[b], want, sizes[b]);
            free(bufs[b]);
        }
    }
    fails += CASE_EXPECT(r, dmrt_comm_wait(c) == 0, "a wait with nothing started: %s", dmrt_rank_error(r));
    /* started all-gathers, between started allreduces (ZeRO 3's prefetch): each block of
     * the result is its rank's data, the allreduce still the sum */
    int k = dmrt_comm_size(c);
    for (int b = 0; b < N_BUF; b++) {
        int64_t n = sizes[b];
        float *send = alloc_floats(n), *recv = alloc_floats(n * k), *sum = alloc_floats(n);
        case_fill(send, n, seed + 100u + (uint32_t)b, me_world);
        case_fill(sum, n, seed + 200u + (uint32_t)b, me_world);
        fails += CASE_EXPECT(r, dmrt_allgather_start(c, send, recv, n, "started all-gather") == 0, "%s", dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_allreduce_start(c, sum, n, "started allreduce") == 0, "%s", dmrt_rank_error(r));
        fails += CASE_EXPECT(r, dmrt_comm_wait(c) == 0, "%s", dmrt_rank_error(r));
        for (int q = 0; q < k; q++) {
            case_fill(scratch, n, seed + 100u + (uint32_t)b, dmrt_comm_member(c, q));
            fails += !case_same(r, "started all-gather", recv + (int64_t)q * n, scratch, n);
        }
        expected_sum(c, want, scratch, n, seed + 200u + (uint32_t)b);
        fails += !case_same(r, "allreduce after a started all-gather", sum, want, n);
        free(send);
        free(recv);
        free(sum);
    }
    free(want);
    free(scratch);
    return fails;
}
