/* bench_common.h: what the two allreduce benchmarks share: the sizes, the clock, the
 * single-thread memcpy baseline, the table. Header-only (static functions) so each
 * benchmark stays one file to read (inline: a benchmark need not use them all). */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* 1 KiB, 4 KiB, ... 64 MiB. */
#define BENCH_MIN_BYTES ((int64_t)1 << 10)
#define BENCH_MAX_BYTES ((int64_t)64 << 20)
/* Each size runs BENCH_BATCHES batches; the table shows the best (fastest) one, the
 * least disturbed by whatever else runs on the machine. */
#define BENCH_BATCHES 5

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Operations per batch: about 256 MiB of data per batch, 5 to 20000 operations. */
static inline int bench_iters(int64_t bytes) {
    int64_t iters = ((int64_t)256 << 20) / bytes;
    return (int)(iters < 5 ? 5 : iters > 20000 ? 20000 : iters);
}

static inline double bench_best(const double *v, int n) {
    double best = v[0];
    for (int i = 1; i < n; i++) best = v[i] < best ? v[i] : best;
    return best;
}

/* Seconds per memcpy of `bytes` on one thread, best of the batches. */
static inline double bench_memcpy(int64_t bytes) {
    char *src = malloc((size_t)bytes), *dst = malloc((size_t)bytes);
    if (!src || !dst) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memset(src, 1, (size_t)bytes);
    memset(dst, 0, (size_t)bytes);
    int iters = bench_iters(bytes);
    double t[BENCH_BATCHES];
    memcpy(dst, src, (size_t)bytes);
    for (int b = 0; b < BENCH_BATCHES; b++) {
        double t0 = bench_now();
        for (int i = 0; i < iters; i++) {
            memcpy(dst, src, (size_t)bytes);
            /* Keep the copies: the compiler may not drop a memcpy whose result is read. */
            __asm__ __volatile__("" : : "r"(dst) : "memory");
        }
        t[b] = (bench_now() - t0) / iters;
    }
    free(src);
    free(dst);
    return bench_best(t, BENCH_BATCHES);
}

static inline void bench_size_text(char *buf, size_t size, int64_t bytes) {
    if (bytes >= (1 << 20)) snprintf(buf, size, "%lld MiB", (long long)(bytes >> 20));
    else snprintf(buf, size, "%lld KiB", (long long)(bytes >> 10));
}

/* nccl-tests' bus bandwidth of an allreduce: 2 (n - 1) / n * bytes / time, in GB/s. */
static inline double bench_busbw(int64_t bytes, int ranks, double seconds) {
    return 2.0 * (ranks - 1) / ranks * (double)bytes / seconds / 1e9;
}

#endif
