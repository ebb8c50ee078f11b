/* gemm_shapes.c: a sequence of matrix products alone, through dmrt_sgemm as generated code
 * calls it: the time a training step would take if it were nothing but its products (the
 * limit bench/mlp_epoch.py reports beside dmc's step).
 *
 * usage: gemm_shapes [-r REPS] TA,TB,M,N,K ...
 *   each shape is one dmrt_sgemm(TA, TB, M, N, K) on operands of its own (row-major,
 *   C = op(A) op(B), beta 0), allocated once and filled with small values. A pass runs every
 *   shape once, in order; after one warm-up pass, REPS passes (default 50) are timed and the
 *   best is printed (other work on the machine only ever makes a pass slower), with the
 *   median:
 *     pass_ms <best> median_ms <median> gflop <per pass> gflops <at the best>
 *   then one line per shape (its best over the passes).
 * Threads: a lone rank's, dmrt_threads_per_rank(1) (DMC_THREADS, else the cores), each
 * product split over them by dmrt_sgemm_split as generated code splits it (until
 * 2026-11-24 one dmrt_sgemm call, which a runtime built with OpenMP runs on one thread
 * whatever the count: the 2-thread limit was the 1-thread one). */
#include "dmrt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
    int ta, tb;
    long long m, n, k;
    float *a, *b, *c;
    double best;
} shape;

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static float *filled(long long count, unsigned *seed) {
    float *p = dmrt_alloc((size_t)count * sizeof *p);
    if (!p) {
        fprintf(stderr, "gemm_shapes: out of memory\n");
        exit(1);
    }
    for (long long i = 0; i < count; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) * 0x1p-24f - 0.5f;
    }
    return p;
}

static void run(shape *s, int threads) {
    /* row strides of A (M x K, or K x M transposed) and B (K x N, or N x K transposed) */
    dmrt_sgemm_split(threads, s->ta, s->tb, s->m, s->n, s->k, 1.0f, s->a, s->ta ? s->m : s->k, s->b,
                     s->tb ? s->k : s->n, 0.0f, s->c, s->n);
}

int main(int argc, char **argv) {
    int reps = 50, first = 1;
    if (argc > 2 && strcmp(argv[1], "-r") == 0) {
        reps = atoi(argv[2]);
        first = 3;
    }
    int count = argc - first;
    if (reps < 1 || count < 1) {
        fprintf(stderr, "usage: gemm_shapes [-r REPS] TA,TB,M,N,K ...\n");
        return 2;
    }
    shape *shapes = calloc((size_t)count, sizeof *shapes);
    double *pass = calloc((size_t)reps, sizeof *pass);
    if (!shapes || !pass) return 1;
    unsigned seed = 1;
    double gflop = 0.0;
    for (int i = 0; i < count; i++) {
        shape *s = &shapes[i];
        char extra;
        if (sscanf(argv[first + i], "%d,%d,%lld,%lld,%lld%c", &s->ta, &s->tb, &s->m, &s->n, &s->k, &extra) != 5 ||
            s->m < 1 || s->n < 1 || s->k < 1) {
            fprintf(stderr, "gemm_shapes: bad shape '%s' (want TA,TB,M,N,K)\n", argv[first + i]);
            return 2;
        }
        s->a = filled(s->m * s->k, &seed);
        s->b = filled(s->k * s->n, &seed);
        s->c = filled(s->m * s->n, &seed);
        s->best = 1e30;
        gflop += 2e-9 * (double)s->m * (double)s->n * (double)s->k;
    }
    int threads = dmrt_threads_per_rank(1);
    for (int i = 0; i < count; i++) run(&shapes[i], threads);
    for (int r = 0; r < reps; r++) {
        double t0 = dmrt_now();
        for (int i = 0; i < count; i++) {
            double ti = dmrt_now();
            run(&shapes[i], threads);
            double dt = dmrt_now() - ti;
            if (dt < shapes[i].best) shapes[i].best = dt;
        }
        pass[r] = dmrt_now() - t0;
    }
    qsort(pass, (size_t)reps, sizeof *pass, cmp_double);
    printf("pass_ms %.3f median_ms %.3f gflop %.4f gflops %.1f\n", 1e3 * pass[0], 1e3 * pass[reps / 2], gflop,
           gflop / pass[0]);
    for (int i = 0; i < count; i++) {
        shape *s = &shapes[i];
        printf("  %d,%d,%lld,%lld,%lld %.3f ms %.1f GFLOP/s\n", s->ta, s->tb, s->m, s->n, s->k, 1e3 * s->best,
               2e-9 * (double)s->m * (double)s->n * (double)s->k / s->best);
        dmrt_free(s->a);
        dmrt_free(s->b);
        dmrt_free(s->c);
    }
    free(shapes);
    free(pass);
    return 0;
}
