/* calibrate.c: the program behind `dmc calibrate` (docs/calibrate.md). It measures this
 * machine and writes a hardware description in the format of passes/hardware.c, so that
 * `dmc --explain/--plan/run --hardware FILE` price plans with what this machine does
 * rather than with a preset's guesses.
 *
 * What it measures, and why that way:
 *   - matrix products through dmrt_sgemm (the call generated code makes) on a grid of
 *     shapes small models use, each with one single-threaded OpenBLAS per core and every
 *     core busy at once: a rank of a data-parallel run on a CPU is a core, and its
 *     neighbours compute at the same time (they share caches, memory and the clock);
 *   - the same shapes on one rank with every core (libdmrt gives a rank alone on its node
 *     all cores: dmrt_threads_per_rank), through dmrt_sgemm_split as generated code calls
 *     it (one-thread OpenBLAS calls on panels; OpenBLAS's own threads without OpenMP);
 *   - memory bandwidth (a copy far larger than the caches), elementwise throughput (an
 *     axpy in cache) and the fixed cost of a small kernel, again with every core busy;
 *   - links with the libdmrt_comm backend the runs will use (threads, or MPI when built
 *     with -DDMC_CALIBRATE_MPI and started by mpirun): allreduce and send/recv ping-pong
 *     from 1 KiB to 16 MiB, fitted by alpha-beta as passes/cost.c prices them.
 * Every time is the best of a few timed runs (other work on the machine only ever makes a
 * run slower), each run long enough for the clock (about 20 ms; --quick: 2 ms). The runs
 * of a grid (product shapes, message sizes) are passes over the whole grid rather than
 * repeats of one size: a neighbour busy for a second then spoils one run of several sizes,
 * not every run of one.
 *
 * The links come first: under MPI every process runs them, then leaves MPI, and world rank
 * 0 alone measures the cores, which the other processes no longer poll.
 *
 * The raw tables are written too (the "measured" object) so that a test can recompute
 * every figure from them (tests/tools/test_calibrate.py). The links and their fits are in
 * calibrate_links.c. */
#include "calibrate_internal.h"
#include "internal.h"
#include "dmrt.h"
#include "dmrt_comm.h"

#include <cblas.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef DMC_CALIBRATE_MPI
#define PROGRAM "dmc-calibrate-mpi"
#define BACKEND "mpi"
#else
#define PROGRAM "dmc-calibrate"
#define BACKEND "threads"
#endif

static const char usage[] =
    "usage: " PROGRAM " [-o FILE] [--backend " BACKEND "] [--ranks N] [--quick]\n"
    "  measures this machine and prints a hardware description for dmc --hardware FILE\n"
    "  (docs/calibrate.md); usually started by `dmc calibrate`\n"
    "  -o FILE     write it to FILE (atomically) instead of standard output\n"
    "  --ranks N   ranks of the link measurements (default 2)"
#ifdef DMC_CALIBRATE_MPI
    "; under mpirun, its -np"
#endif
    "\n"
    "  --quick     fewer sizes and shorter runs (a few seconds; for tests)\n";

/* ---- timing one workload on a crew of threads ------------------------------------------ */

/* A measured thing: setup makes one thread's buffers (NULL when out of memory), call
 * does one unit of work, teardown frees. */
typedef struct workload {
    void *(*setup)(const void *params);
    void (*call)(void *state);
    void (*teardown)(void *state);
    const void *params;
    double target;      /* seconds per timed run */
    int runs;
    int64_t reps;       /* calls per timed run; 0: probe for target */
} workload;

typedef struct crew {
    int threads;
    const workload *w;
    pthread_barrier_t barrier;
    int *ready;         /* [threads] setup succeeded */
    double *probe;      /* [threads] seconds of the current probe */
    double *best;       /* [threads] best seconds per call */
    int64_t reps;       /* calls per timed run, the same for every thread */
} crew;

typedef struct member {
    crew *c;
    int index;
} member;

static double slowest_probe(const crew *c) {
    double t = 0;
    for (int i = 0; i < c->threads; i++)
        if (c->probe[i] > t) t = c->probe[i];
    return t;
}

/* Every thread runs the same: setup, a warm-up call, unless w->reps says how many calls a
 * run makes probes of growing length until the slowest thread's reaches an eighth of the
 * target (so the rep count is known to about 10%), then the timed runs, each started
 * together at a barrier. Decisions are taken by every thread from the same shared numbers
 * read between barriers, so all agree. */
static void *crew_thread(void *arg) {
    member *me = arg;
    crew *c = me->c;
    const workload *w = c->w;
    void *state = w->setup(w->params);
    c->ready[me->index] = state != NULL;
    pthread_barrier_wait(&c->barrier);
    for (int i = 0; i < c->threads; i++)
        if (!c->ready[i]) {
            if (state) w->teardown(state);
            return NULL;
        }
    w->call(state);
    int64_t n = 1, reps = w->reps;
    double slowest;
    for (; reps == 0;) {
        pthread_barrier_wait(&c->barrier);
        double t0 = dmrt_now();
        for (int64_t r = 0; r < n; r++) w->call(state);
        c->probe[me->index] = dmrt_now() - t0;
        pthread_barrier_wait(&c->barrier);
        slowest = slowest_probe(c);
        if (slowest >= w->target / 8 || n >= ((int64_t)1 << 40)) {
            double want = ceil((double)n * w->target / (slowest > 0 ? slowest : 1e-9));
            reps = want < 1 ? 1 : want > 1e12 ? (int64_t)1e12 : (int64_t)want;
        } else {
            n *= slowest > 0 && w->target / 8 / slowest < 16 ? 4 : 64;
        }
    }
    double best = INFINITY;
    for (int run = 0; run < w->runs; run++) {
        pthread_barrier_wait(&c->barrier);
        double t0 = dmrt_now();
        for (int64_t r = 0; r < reps; r++) w->call(state);
        double t = (dmrt_now() - t0) / (double)reps;
        if (t < best) best = t;
    }
    c->best[me->index] = best;
    if (me->index == 0) c->reps = reps;
    w->teardown(state);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per call of w on `threads` threads at once: each thread's best run, the median
 * over threads. Returns -1 with a message when threads or memory are lacking. */
static int time_on_crew(const workload *w, int threads, double *seconds, int64_t *reps, char *err, size_t errlen) {
    crew c = {.threads = threads, .w = w};
    c.ready = calloc((size_t)threads, sizeof *c.ready);
    c.probe = calloc((size_t)threads, sizeof *c.probe);
    c.best = calloc((size_t)threads, sizeof *c.best);
    pthread_t *tid = calloc((size_t)threads, sizeof *tid);
    member *m = calloc((size_t)threads, sizeof *m);
    int status = -1, started = 0;
    if (!c.ready || !c.probe || !c.best || !tid || !m) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    if (pthread_barrier_init(&c.barrier, NULL, (unsigned)threads) != 0) {
        snprintf(err, errlen, "cannot make a barrier of %d threads", threads);
        goto done;
    }
    /* One thread: the caller's own, whose OpenMP team (a lone rank's split products) then
     * lives across every measurement; a new thread's first teams stall for milliseconds. */
    const int on_caller = threads == 1;
    if (on_caller) {
        m[0] = (member){&c, 0};
        crew_thread(&m[0]);
    }
    for (started = on_caller; started < threads; started++) {
        m[started] = (member){&c, started};
        int e = pthread_create(&tid[started], NULL, crew_thread, &m[started]);
        if (e != 0) {
            /* the started ones wait at the first barrier forever: nothing to do but exit */
            fprintf(stderr, PROGRAM ": error: cannot start thread %d: %s\n", started, strerror(e));
            exit(1);
        }
    }
    for (int i = on_caller; i < threads; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&c.barrier);
    status = 0;
    for (int i = 0; i < threads; i++)
        if (!c.ready[i]) status = -1;
    if (status) {
        snprintf(err, errlen, "out of memory for the buffers of %d threads", threads);
        goto done;
    }
    qsort(c.best, (size_t)threads, sizeof *c.best, cmp_double);
    *seconds = threads % 2 ? c.best[threads / 2] : 0.5 * (c.best[threads / 2 - 1] + c.best[threads / 2]);
    if (reps) *reps = c.reps;
done:
    free(c.ready);
    free(c.probe);
    free(c.best);
    free(tid);
    free(m);
    return status;
}

/* ---- the workloads ---------------------------------------------------------------------- */

typedef struct gemm_shape {
    int64_t m, n, k;
    int quick;          /* also measured by --quick */
} gemm_shape;

/* Square products from 16 to 2048 and the rectangles small models make: an MLP's layers
 * on a batch of 1024 (k = 128 or 512, 128 or 512 outputs), its 784-pixel input layer on a
 * batch of 32 and its 10-class head, a small attention head's 64 x 64 x 32. */
static const gemm_shape shapes[] = {
    {16, 16, 16, 1},       {32, 32, 32, 1},       {64, 64, 64, 1},     {128, 128, 128, 1},
    {256, 256, 256, 1},    {512, 512, 512, 1},    {1024, 1024, 1024, 0}, {2048, 2048, 2048, 0},
    {64, 64, 32, 1},       {1024, 128, 128, 1},   {1024, 512, 128, 0}, {1024, 128, 512, 0},
    {2048, 10, 1024, 0},   {32, 1024, 784, 1},
};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

typedef struct gemm_state {
    gemm_shape s;
    float *a, *b, *c;   /* (m, k), (k, n), (m, n), row-major */
} gemm_state;

static void gemm_teardown(void *p) {
    gemm_state *g = p;
    free(g->a);
    free(g->b);
    free(g->c);
    free(g);
}

static void *gemm_setup(const void *params) {
    gemm_state *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->s = *(const gemm_shape *)params;
    g->a = malloc(sizeof(float) * (size_t)(g->s.m * g->s.k));
    g->b = malloc(sizeof(float) * (size_t)(g->s.k * g->s.n));
    g->c = malloc(sizeof(float) * (size_t)(g->s.m * g->s.n));
    if (!g->a || !g->b || !g->c) {
        gemm_teardown(g);
        return NULL;
    }
    /* small ordinary values: no denormals, nothing that overflows */
    for (int64_t i = 0; i < g->s.m * g->s.k; i++) g->a[i] = 0.01f * (float)(i % 13);
    for (int64_t i = 0; i < g->s.k * g->s.n; i++) g->b[i] = 0.01f * (float)(i % 7);
    memset(g->c, 0, sizeof(float) * (size_t)(g->s.m * g->s.n));
    return g;
}

static void gemm_call(void *p) {
    gemm_state *g = p;
    dmrt_sgemm(0, 0, g->s.m, g->s.n, g->s.k, 1.0f, g->a, g->s.k, g->b, g->s.n, 0.0f, g->c, g->s.n);
}

/* A lone rank's product, on every core. */
static void gemm_split_call(void *p) {
    gemm_state *g = p;
    dmrt_sgemm_split(dmrt_cores(), 0, 0, g->s.m, g->s.n, g->s.k, 1.0f, g->a, g->s.k, g->b, g->s.n, 0.0f, g->c, g->s.n);
}

typedef struct copy_state {
    size_t bytes;
    char *src, *dst;
} copy_state;

static void copy_teardown(void *p) {
    copy_state *s = p;
    free(s->src);
    free(s->dst);
    free(s);
}

static void *copy_setup(const void *params) {
    copy_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->bytes = *(const size_t *)params;
    s->src = malloc(s->bytes);
    s->dst = malloc(s->bytes);
    if (!s->src || !s->dst) {
        copy_teardown(s);
        return NULL;
    }
    /* touched by the thread that copies: its pages are mapped before the clock starts */
    memset(s->src, 1, s->bytes);
    memset(s->dst, 0, s->bytes);
    return s;
}

static void copy_call(void *p) {
    copy_state *s = p;
    memcpy(s->dst, s->src, s->bytes);
}

/* The elementwise kernels: loops with constant trip counts over plain pointers, as
 * generated code writes them (and compiled as it is: -O3 -march=native, runtime/meson.build). */
#define VECTOR_ELEMENTS 65536   /* 2 x 256 KiB: in cache, so the arithmetic is what is timed */
#define KERNEL_ELEMENTS 16      /* so little work that the call and the loop's start dominate */

typedef struct axpy_state {
    float *x, *y;
    int64_t n;          /* elements of each */
} axpy_state;

static void axpy_teardown(void *p) {
    axpy_state *s = p;
    free(s->x);
    free(s->y);
    free(s);
}

/* params: the elements (an int64_t), or NULL for VECTOR_ELEMENTS */
static void *axpy_setup(const void *params) {
    axpy_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n = params ? *(const int64_t *)params : VECTOR_ELEMENTS;
    s->x = malloc(sizeof(float) * (size_t)s->n);
    s->y = malloc(sizeof(float) * (size_t)s->n);
    if (!s->x || !s->y) {
        axpy_teardown(s);
        return NULL;
    }
    for (int64_t i = 0; i < s->n; i++) s->x[i] = 1e-3f * (float)(i % 17), s->y[i] = 0;
    return s;
}

/* y = 0.5 x + y over s->n elements (VECTOR_ELEMENTS: the cores' element rate; fewer: the
 * cache's bandwidth, on arrays that stay in it). y grows by at most 0.008 a call: no
 * overflow and no denormals in any run */
static void axpy_call(void *p) {
    axpy_state *s = p;
    float *x = s->x, *y = s->y, a = 0.5f;
    for (int64_t i = 0; i < s->n; i++) y[i] = x[i] * a + y[i];
}

static void axpy16_call(void *p) {
    axpy_state *s = p;
    float *x = s->x, *y = s->y, a = 0.5f;
    for (int64_t i = 0; i < KERNEL_ELEMENTS; i++) y[i] = x[i] * a + y[i];
}

/* ---- the description -------------------------------------------------------------------- */

typedef struct gemm_row {
    gemm_shape s;
    double flops, seconds;
    int64_t reps;
} gemm_row;

typedef struct results {
    int cores;
    double memory_bytes;
    gemm_row gemm[N_SHAPES], lone[N_SHAPES];
    int n_gemm;
    size_t copy_bytes;
    double copy_seconds, vector_seconds, kernel_seconds;
    int64_t copy_reps, vector_reps, kernel_reps;
    size_t cache_bytes;     /* the last-level cache (0: unknown, and not measured) */
    int64_t cache_elements; /* of each array of the in-cache axpy */
    double cache_seconds;
    int64_t cache_reps;
    double busy_before;     /* cores busy with other work when calibrate started (-1: unknown) */
} results;

/* ascending flops; equal flops by m, then n: the same order on every run */
static int by_flops(const void *a, const void *b) {
    const gemm_row *x = a, *y = b;
    if (x->flops != y->flops) return x->flops < y->flops ? -1 : 1;
    if (x->s.m != y->s.m) return x->s.m < y->s.m ? -1 : 1;
    return x->s.n < y->s.n ? -1 : x->s.n > y->s.n;
}

/* The last-level cache, from sysfs (0 when unknown): the copy must be far larger. */
static size_t last_cache_bytes(void) {
    size_t best = 0;
    for (int index = 0; index < 8; index++) {
        char path[96], text[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(text, sizeof text, f)) {
            char *end;
            unsigned long long v = strtoull(text, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            if (v > best) best = (size_t)v;
        }
        fclose(f);
    }
    return best;
}

/* Cores' worth of work other processes did over 0.2 s before calibrate starts (Linux's
 * /proc/stat), or -1 when unknown: other work on the cores makes every figure low, and the
 * file should say so. (Not the load average: it remembers the last minute, a previous
 * calibration's included.) */
static int cpu_times(double *busy, double *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]);
    fclose(f);
    if (n < 4) return -1;
    *total = 0;
    for (int i = 0; i < 8; i++) *total += (double)v[i];
    *busy = *total - (double)v[3] - (double)v[4];     /* all but idle and iowait */
    return 0;
}

static double busy_cores(int cores) {
    double b0, t0, b1, t1;
    if (cpu_times(&b0, &t0)) return -1;
    struct timespec pause = {0, 200000000};
    nanosleep(&pause, NULL);
    if (cpu_times(&b1, &t1) || t1 <= t0) return -1;
    return (b1 - b0) / (t1 - t0) * cores;
}

/* Times every product of a grid on `threads` threads at once (1: one rank, with the
 * OpenBLAS threads set before): cfg->runs passes over the grid, one timed run of each
 * shape per pass, the best kept; the first pass also finds each shape's calls per run. */
static int time_grid(gemm_row *rows, int n, int threads, int cores, const config *cfg, char *err, size_t errlen) {
    for (int pass = 0; pass < cfg->runs; pass++)
        for (int i = 0; i < n; i++) {
            workload w = {gemm_setup, threads > 1 ? gemm_call : gemm_split_call, gemm_teardown, &rows[i].s, cfg->target, 1,
                          rows[i].reps};
            double t;
            if (time_on_crew(&w, threads, &t, &rows[i].reps, err, errlen)) return -1;
            if (t < rows[i].seconds) rows[i].seconds = t;
        }
    for (int i = 0; i < n; i++) {
        fprintf(stderr, PROGRAM ": sgemm %" PRId64 "x%" PRId64 "x%" PRId64, rows[i].s.m, rows[i].s.n, rows[i].s.k);
        if (threads > 1) fprintf(stderr, " on %d cores at once: %.3g GFLOP/s each\n", threads, rows[i].flops / rows[i].seconds * 1e-9);
        else fprintf(stderr, " on one rank of %d threads: %.3g GFLOP/s\n", cores, rows[i].flops / rows[i].seconds * 1e-9);
    }
    return 0;
}

static int measure_cores(const config *cfg, results *res, char *err, size_t errlen) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (cores < 1 || pages < 1 || page < 1) {
        snprintf(err, errlen, "cannot read the number of cores or the memory size (sysconf)");
        return -1;
    }
    res->cores = (int)cores;
    res->memory_bytes = (double)pages * (double)page;
    int T = res->cores;

    /* every core busy: one single-threaded OpenBLAS per thread */
    openblas_set_num_threads(1);
    res->n_gemm = 0;
    for (int i = 0; i < N_SHAPES; i++) {
        if (cfg->quick && !shapes[i].quick) continue;
        gemm_row *row = &res->gemm[res->n_gemm++];
        *row = (gemm_row){.s = shapes[i], .seconds = INFINITY};
        row->flops = 2.0 * (double)shapes[i].m * (double)shapes[i].n * (double)shapes[i].k;
    }
    qsort(res->gemm, (size_t)res->n_gemm, sizeof res->gemm[0], by_flops);
    if (time_grid(res->gemm, res->n_gemm, T, T, cfg, err, errlen)) return -1;

    /* a copy 8 times the last-level cache over all threads, and at least 64 MiB each */
    size_t cache = last_cache_bytes(), bytes = (size_t)(cfg->quick ? 32 : 64) << 20;
    if (cache * 8 / (size_t)T > bytes) bytes = cache * 8 / (size_t)T;
    res->copy_bytes = bytes;
    workload copy = {copy_setup, copy_call, copy_teardown, &res->copy_bytes, cfg->target, cfg->runs, 0};
    if (time_on_crew(&copy, T, &res->copy_seconds, &res->copy_reps, err, errlen)) return -1;
    fprintf(stderr, PROGRAM ": copy of %zu MiB on %d cores at once: %.3g GB/s each\n", bytes >> 20, T,
            2.0 * (double)bytes / res->copy_seconds * 1e-9);

    workload vec = {axpy_setup, axpy_call, axpy_teardown, NULL, cfg->target, cfg->runs, 0};
    if (time_on_crew(&vec, T, &res->vector_seconds, &res->vector_reps, err, errlen)) return -1;
    fprintf(stderr, PROGRAM ": axpy of %d floats on %d cores at once: %.3g Gop/s each\n", VECTOR_ELEMENTS, T,
            2.0 * VECTOR_ELEMENTS / res->vector_seconds * 1e-9);

    /* the same axpy on arrays that fill half of each thread's share of the last-level
     * cache: what the update, streaming through parameters and optimizer state that stay
     * in cache between steps, moves per core (3 floats an element: x, y read, y written) */
    res->cache_bytes = cache;
    if (cache > 0) {
        res->cache_elements = (int64_t)(cache / (size_t)T / 2 / (2 * sizeof(float)));
        workload cached = {axpy_setup, axpy_call, axpy_teardown, &res->cache_elements, cfg->target, cfg->runs, 0};
        if (time_on_crew(&cached, T, &res->cache_seconds, &res->cache_reps, err, errlen)) return -1;
        fprintf(stderr, PROGRAM ": axpy of %" PRId64 " floats (in a %zu KiB cache) on %d cores at once: %.3g GB/s each\n",
                res->cache_elements, cache >> 10, T, 12.0 * (double)res->cache_elements / res->cache_seconds * 1e-9);
    }

    /* many short runs: the minimum is the overhead without interruptions */
    workload kern = {axpy_setup, axpy16_call, axpy_teardown, NULL, 2e-5, cfg->quick ? 50 : 300, 0};
    if (time_on_crew(&kern, T, &res->kernel_seconds, &res->kernel_reps, err, errlen)) return -1;
    fprintf(stderr, PROGRAM ": a kernel of %d floats: %.3g ns\n", KERNEL_ELEMENTS, res->kernel_seconds * 1e9);

    /* one rank alone on the node: its products have every core */
#ifndef _OPENMP
    openblas_set_num_threads(T);
#endif
    for (int i = 0; i < res->n_gemm; i++) res->lone[i] = (gemm_row){.s = res->gemm[i].s, .flops = res->gemm[i].flops,
                                                                    .seconds = INFINITY};
    return time_grid(res->lone, res->n_gemm, 1, T, cfg, err, errlen);
}

/* [[flops, efficiency], ...] ascending in flops: shapes of equal flops (1024 x 128 x 128
 * and 256^3) share one point, their mean, as the cost model knows a product by its flops
 * only. Efficiency = flop/s / peak, at most 1. */
static json_t *size_curve(const gemm_row *rows, int n, double peak, double *last) {
    json_t *curve = json_array();
    for (int i = 0; i < n;) {
        int j = i;
        double sum = 0;
        for (; j < n && rows[j].flops == rows[i].flops; j++) sum += rows[j].flops / rows[j].seconds / peak;
        double e = sum / (j - i);
        if (e > 1) e = 1;
        *last = e;
        json_array_append_new(curve, json_pack("[I, f]", (json_int_t)rows[i].flops, e));
        i = j;
    }
    return curve;
}

static json_t *gemm_table(const gemm_row *rows, int n) {
    json_t *t = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(t, json_pack("{sI, sI, sI, sI, sf, sI}", "m", (json_int_t)rows[i].s.m, "n",
                                           (json_int_t)rows[i].s.n, "k", (json_int_t)rows[i].s.k, "flops",
                                           (json_int_t)rows[i].flops, "seconds", rows[i].seconds, "reps", (json_int_t)rows[i].reps));
    return t;
}

static json_t *describe(const config *cfg, const results *res, const link_run *lr, char *err, size_t errlen) {
    int T = res->cores;
    double peak = 0;
    for (int i = 0; i < res->n_gemm; i++)
        if (res->gemm[i].flops / res->gemm[i].seconds > peak) peak = res->gemm[i].flops / res->gemm[i].seconds;
    double matmul_eff = 1, lone_last = 1;
    json_t *by_size = size_curve(res->gemm, res->n_gemm, peak, &matmul_eff);
    json_t *lone_by_size = size_curve(res->lone, res->n_gemm, peak * T, &lone_last);
    double bandwidth = 2.0 * (double)res->copy_bytes / res->copy_seconds;
    double vector = 2.0 * VECTOR_ELEMENTS / res->vector_seconds;

    double am[LINK_SIZES], as[LINK_SIZES], sm[LINK_SIZES], ss[LINK_SIZES];
    calibrate_link_terms(&lr->allreduce, LINK_ALLREDUCE, lr->ranks, am, as);
    calibrate_link_terms(&lr->sendrecv, LINK_SENDRECV, lr->ranks, sm, ss);
    alpha_beta fa, fs;
    if (calibrate_fit_alpha_beta(am, as, lr->allreduce.seconds, lr->allreduce.n, &fa) ||
        calibrate_fit_alpha_beta(sm, ss, lr->sendrecv.seconds, lr->sendrecv.n, &fs)) {
        snprintf(err, errlen, "link times do not grow with the message size: no bandwidth fits them");
        json_decref(by_size);
        json_decref(lone_by_size);
        return NULL;
    }
    double fa_on_s = calibrate_link_error(&fa, &lr->sendrecv, LINK_SENDRECV, lr->ranks);
    double fs_on_a = calibrate_link_error(&fs, &lr->allreduce, LINK_ALLREDUCE, lr->ranks);
    /* send/recv (what pipelines do, and one message is what latency means) unless the
     * allreduce's fit describes both tables better: the file has one link for both */
    int use_allreduce = (fa.max_relative_error > fa_on_s ? fa.max_relative_error : fa_on_s) <
                        (fs.max_relative_error > fs_on_a ? fs.max_relative_error : fs_on_a);
    const alpha_beta *link = use_allreduce ? &fa : &fs;

    char host[64] = "", name[64], when[32] = "?", notes[1536];
    if (gethostname(host, sizeof host - 1) != 0 || !*host) snprintf(host, sizeof host, "this machine");
    snprintf(name, sizeof name, "calibrated %.50s", host);
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", &tm);
    const char *blas = openblas_get_config();
    snprintf(notes, sizeof notes,
             "dmc calibrate%s on %s, %s: %d cores; products through dmrt_sgemm (%s), one single-threaded "
             "OpenBLAS per core with every core busy (lone_rank: one rank with %d threads); memory, vector and kernel "
             "figures per core with every core busy; links: the %s backend with %d ranks, intra_node is the "
             "%s fit (the %s fit: latency %.3g s, bandwidth %.3g B/s); inter_node copies intra_node: one "
             "machine cannot measure it; peak_flops.tf32 and .bf16 copy the fp32 peak, not measured (bf16 products "
             "through dmrt_gemm_bf16 are not timed: docs/calibrate.md)",
             cfg->quick ? " --quick" : "", host, when, T, blas ? blas : "OpenBLAS", T, BACKEND, lr->ranks,
             use_allreduce ? "allreduce" : "send/recv", use_allreduce ? "send/recv" : "allreduce",
             use_allreduce ? fs.latency : fa.latency, use_allreduce ? fs.bandwidth : fa.bandwidth);
    if (res->busy_before >= 0) {
        size_t len = strlen(notes);
        snprintf(notes + len, sizeof notes - len, "; other work kept %.2f cores busy at the start", res->busy_before);
    }

    json_t *root = json_object();
    json_object_set_new(root, "name", json_string(name));
    json_object_set_new(root, "notes", json_string(notes));
    /* Only sgemm is timed: tf32 and bf16 get its peak, whatever the CPU (an AVX512-BF16 one
     * with oneDNN may multiply bf16 faster, one without converts operands and multiplies
     * slower). The notes and docs/calibrate.md say so rather than claim a measured figure. */
    json_object_set_new(root, "device",
                        json_pack("{s{sfsfsf}, sI, sf, sf}", "peak_flops", "fp32", peak, "tf32", peak, "bf16", peak,
                                  "memory_bytes", (json_int_t)(res->memory_bytes / T), "memory_bandwidth", bandwidth,
                                  "vector_flops", vector));
    if (res->cache_bytes > 0) {
        json_t *device = json_object_get(root, "device");
        json_object_set_new(device, "cache_bytes", json_integer((json_int_t)(res->cache_bytes / (size_t)T)));
        json_object_set_new(device, "cache_bandwidth", json_real(12.0 * (double)res->cache_elements / res->cache_seconds));
    }
    json_object_set_new(root, "devices_per_node", json_integer(T));
    json_object_set_new(root, "intra_node", json_pack("{sf, sf}", "bandwidth", link->bandwidth, "latency", link->latency));
    json_object_set_new(root, "inter_node", json_pack("{sf, sf}", "bandwidth", link->bandwidth, "latency", link->latency));
    json_object_set_new(root, "efficiency", json_pack("{sf, si, si, so}", "matmul", matmul_eff, "memory", 1, "link", 1,
                                                      "matmul_by_size", by_size));
    json_object_set_new(root, "kernel_overhead", json_real(res->kernel_seconds));
    json_object_set_new(root, "lone_rank", json_pack("{si, so}", "threads", T, "matmul_by_size", lone_by_size));

    json_t *m = json_object();
    json_object_set_new(m, "mode", json_string(cfg->quick ? "quick" : "full"));
    json_object_set_new(m, "cores", json_integer(T));
    json_object_set_new(m, "memory_bytes", json_integer((json_int_t)res->memory_bytes));
    if (res->busy_before >= 0) json_object_set_new(m, "busy_cores_before", json_real(res->busy_before));
    json_object_set_new(m, "gemm", gemm_table(res->gemm, res->n_gemm));
    json_object_set_new(m, "lone_rank_gemm", gemm_table(res->lone, res->n_gemm));
    json_object_set_new(m, "copy", json_pack("{sI, sf, sI}", "bytes", (json_int_t)res->copy_bytes, "seconds",
                                             res->copy_seconds, "reps", (json_int_t)res->copy_reps));
    json_object_set_new(m, "vector", json_pack("{si, sf, sI}", "elements", VECTOR_ELEMENTS, "seconds",
                                               res->vector_seconds, "reps", (json_int_t)res->vector_reps));
    if (res->cache_bytes > 0)
        json_object_set_new(m, "cache", json_pack("{sI, sI, sf, sI}", "last_level_bytes", (json_int_t)res->cache_bytes,
                                                  "elements", (json_int_t)res->cache_elements, "seconds",
                                                  res->cache_seconds, "reps", (json_int_t)res->cache_reps));
    json_object_set_new(m, "kernel", json_pack("{si, sf, sI}", "elements", KERNEL_ELEMENTS, "seconds",
                                               res->kernel_seconds, "reps", (json_int_t)res->kernel_reps));
    json_t *links = json_object();
    json_object_set_new(links, "backend", json_string(BACKEND));
    json_object_set_new(links, "ranks", json_integer(lr->ranks));
    json_object_set_new(links, "allreduce", calibrate_link_json(&lr->allreduce));
    json_object_set_new(links, "sendrecv", calibrate_link_json(&lr->sendrecv));
    json_object_set_new(links, "fits", json_pack("{so, so}", "allreduce", calibrate_fit_json(&fa, fa_on_s), "sendrecv",
                                                 calibrate_fit_json(&fs, fs_on_a)));
    json_object_set_new(links, "intra_node", json_string(use_allreduce ? "allreduce" : "sendrecv"));
    json_object_set_new(m, "links", links);
    json_object_set_new(root, "measured", m);
    return root;
}

/* ---- writing ---------------------------------------------------------------------------- */

static int is_scalar(const json_t *v) { return !json_is_object(v) && !json_is_array(v); }

/* An array or object of scalars: printed on one line. */
static int is_flat(json_t *v) {
    if (is_scalar(v)) return 1;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!is_scalar(json_array_get(v, i))) return 0;
        return 1;
    }
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) if (!is_scalar(x)) return 0;
    return 1;
}

static void write_scalar(FILE *f, json_t *v) {
    if (json_is_real(v)) {
        fprintf(f, "%.6g", json_real_value(v));
    } else {
        char *text = json_dumps(v, JSON_ENCODE_ANY);
        fputs(text ? text : "null", f);
        free(text);
    }
}

/* JSON as people read it: objects of objects indented, every flat object or array (a fit,
 * a table's row, a size curve's point) on one line; numbers to 6 significant digits. */
static void write_json(FILE *f, json_t *v, int indent) {
    if (is_scalar(v)) {
        write_scalar(f, v);
        return;
    }
    int flat = is_flat(v), array = json_is_array(v);
    size_t n = array ? json_array_size(v) : json_object_size(v), i = 0;
    fputc(array ? '[' : '{', f);
    const char *key = NULL;
    void *it = array ? NULL : json_object_iter(v);
    for (; i < n; i++) {
        json_t *x = array ? json_array_get(v, i) : json_object_iter_value(it);
        if (!array) key = json_object_iter_key(it);
        if (flat) fputs(i ? ", " : "", f);
        else fprintf(f, "%s\n%*s", i ? "," : "", indent + 2, "");
        if (key) {
            json_t *k = json_string(key);
            write_scalar(f, k);
            json_decref(k);
            fputs(": ", f);
        }
        write_json(f, x, indent + 2);
        if (!array) it = json_object_iter_next(v, it);
    }
    if (!flat && n) fprintf(f, "\n%*s", indent, "");
    fputc(array ? ']' : '}', f);
}

/* To path through a temporary file and a rename: a reader never sees half a file. */
static int write_file(json_t *root, const char *path, char *err, size_t errlen) {
    if (!path) {
        write_json(stdout, root, 0);
        fputc('\n', stdout);
        return fflush(stdout) == 0 ? 0 : -1;
    }
    char tmp[4200], target[4096], why[256];
    const char *to = dmrt_atomic_target(path, target, sizeof target, why, sizeof why); /* through a link */
    if (!to) {
        snprintf(err, errlen, "cannot write %s: %s", path, why);
        return -1;
    }
    path = to;
    FILE *f = dmrt_temporary_beside(path, tmp, sizeof tmp);
    if (!f) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    write_json(f, root, 0);
    fputc('\n', f);
    int failed = fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0;
    int e = errno;
    if (fclose(f) != 0 && !failed) failed = 1, e = errno;
    if (!failed && rename(tmp, path) != 0) failed = 1, e = errno;
    if (failed) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(e));
        remove(tmp);
        return -1;
    }
    return 0;
}

/* ---- main ------------------------------------------------------------------------------- */

static int parse_args(int argc, char **argv, config *cfg) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-o") == 0 && i + 1 < argc) {
            cfg->out = argv[++i];
        } else if (strcmp(a, "--backend") == 0 && i + 1 < argc) {
            if (strcmp(argv[++i], BACKEND) != 0) {
                fprintf(stderr, PROGRAM ": error: --backend %s: this program measures the " BACKEND
                                " backend (dmc calibrate --backend %s starts the right one)\n",
                        argv[i], argv[i]);
                return -1;
            }
        } else if (strcmp(a, "--ranks") == 0 && i + 1 < argc) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || n < 2 || n > 1024) {
                fprintf(stderr, PROGRAM ": error: --ranks takes an integer from 2 to 1024, got '%s'\n", argv[i]);
                return -1;
            }
            cfg->ranks = (int)n;
        } else if (strcmp(a, "--quick") == 0) {
            cfg->quick = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else {
            fprintf(stderr, PROGRAM ": error: %s '%s'\n%s",
                    strcmp(a, "-o") == 0 || strcmp(a, "--backend") == 0 || strcmp(a, "--ranks") == 0
                        ? "missing value after" : "unknown option",
                    a, usage);
            return -1;
        }
    }
    cfg->target = cfg->quick ? 2e-3 : 20e-3;
    cfg->runs = 3;
    return 0;
}

int main(int argc, char **argv) {
    config cfg = {0};
    if (parse_args(argc, argv, &cfg)) return 2;
    double start = dmrt_now();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    double busy = busy_cores(online > 0 ? (int)online : 1);
    link_run lr = {.cfg = &cfg};
    char err[4096] = "";
    int status;
#ifdef DMC_CALIBRATE_MPI
    status = dmrt_mpi_run(&argc, &argv, calibrate_links_main, &lr, err, sizeof err);
    if (status != 0) {
        if (lr.me == 0) fprintf(stderr, PROGRAM ": error: measuring the links: %s\n", err);
        return 1;
    }
    if (!lr.measured) return 0;     /* not world rank 0: its part is done */
#else
    status = dmrt_threads_run(cfg.ranks ? cfg.ranks : 2, calibrate_links_main, &lr, err, sizeof err);
    if (status != 0) {
        fprintf(stderr, PROGRAM ": error: measuring the links: %s\n", err);
        return 1;
    }
#endif
    /* said here, by the one process that writes the file (under MPI every one looked) */
    if (busy > 0.25)
        fprintf(stderr, PROGRAM ": warning: other work kept %.2f cores busy when calibrate started: the figures "
                        "will be lower than this machine's\n", busy);
    for (int i = 0; i < lr.sendrecv.n; i++)
        fprintf(stderr, PROGRAM ": %.0f bytes: allreduce over %d ranks %.3g us, one message %.3g us\n",
                lr.sendrecv.bytes[i], lr.ranks, lr.allreduce.seconds[i] * 1e6, lr.sendrecv.seconds[i] * 1e6);
    results res;
    memset(&res, 0, sizeof res);
    res.busy_before = busy;
    if (measure_cores(&cfg, &res, err, sizeof err)) {
        fprintf(stderr, PROGRAM ": error: %s\n", err);
        return 1;
    }
    json_t *root = describe(&cfg, &res, &lr, err, sizeof err);
    if (!root) {
        fprintf(stderr, PROGRAM ": error: %s\n", err);
        return 1;
    }
    json_object_set_new(json_object_get(root, "measured"), "seconds", json_real(dmrt_now() - start));
    status = write_file(root, cfg.out, err, sizeof err);
    json_decref(root);
    if (status) {
        fprintf(stderr, PROGRAM ": error: %s\n", err);
        return 1;
    }
    fprintf(stderr, PROGRAM ": done in %.1f s%s%s\n", dmrt_now() - start, cfg.out ? ": " : "", cfg.out ? cfg.out : "");
    return 0;
}
