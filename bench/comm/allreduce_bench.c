/* allreduce_bench: bus bandwidth of the threads backend's allreduce, 1 KiB to 64 MiB,
 * next to single-thread memcpy of the same size (docs/comm.md).
 *
 *   allreduce_bench [RANKS...]     default: 2 4
 *
 * Bus bandwidth as nccl-tests define it: 2 (n - 1) / n * bytes / time. Each size runs 5
 * batches of back-to-back in-place allreduces (about 256 MiB moved per batch) between
 * barriers, timed on rank 0; the table shows the best batch. memcpy: one thread, same
 * bytes, bytes / time. The ratio is busbw / memcpy. Results are checked once per size. */
#include "bench_common.h"
#include "dmrt_comm.h"

typedef struct bench_arg {
    int64_t bytes;
    double seconds;  /* out: best seconds per allreduce (rank 0) */
    int ok;          /* out: the checked allreduce was right (rank 0) */
} bench_arg;

static int bench_rank(dmrt_rank *r, void *p) {
    bench_arg *a = p;
    dmrt_comm *w = dmrt_rank_world(r);
    int64_t n = a->bytes / (int64_t)sizeof(float);
    int ranks = dmrt_rank_count(r), id = dmrt_rank_id(r);
    float *buf = malloc((size_t)a->bytes);
    if (!buf) return 1;
    /* Check: rank k holds k + 1 everywhere; the sum is ranks (ranks + 1) / 2. */
    for (int64_t i = 0; i < n; i++) buf[i] = (float)(id + 1);
    if (dmrt_allreduce_sum(w, buf, n, "check") != 0) return 1;
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= buf[i] == (float)(ranks * (ranks + 1) / 2);
    /* Zeros while timing: sums stay 0, no overflow or denormals over many iterations. */
    memset(buf, 0, (size_t)a->bytes);
    int iters = bench_iters(a->bytes);
    double t[BENCH_BATCHES];
    for (int b = 0; b < BENCH_BATCHES; b++) {
        if (dmrt_barrier(w, "batch start")) return 1;
        double t0 = bench_now();
        for (int i = 0; i < iters; i++)
            if (dmrt_allreduce_sum(w, buf, n, "bench")) return 1;
        if (dmrt_barrier(w, "batch end")) return 1;
        t[b] = (bench_now() - t0) / iters;
    }
    if (id == 0) {
        a->seconds = bench_best(t, BENCH_BATCHES);
        a->ok = ok;
    }
    free(buf);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    int rank_counts[16], n_counts = 0;
    for (int i = 1; i < argc && n_counts < 16; i++) rank_counts[n_counts++] = atoi(argv[i]);
    if (n_counts == 0) {
        rank_counts[n_counts++] = 2;
        rank_counts[n_counts++] = 4;
    }
    for (int k = 0; k < n_counts; k++) {
        int ranks = rank_counts[k];
        printf("threads backend, %d ranks: in-place allreduce (best of %d batches)\n", ranks,
               BENCH_BATCHES);
        printf("%8s %12s %12s %14s %8s\n", "size", "time (us)", "busbw GB/s", "memcpy GB/s",
               "ratio");
        for (int64_t bytes = BENCH_MIN_BYTES; bytes <= BENCH_MAX_BYTES; bytes *= 4) {
            bench_arg a = {bytes, 0, 0};
            char err[1024];
            if (dmrt_threads_run(ranks, bench_rank, &a, err, sizeof err) != 0 || !a.ok) {
                fprintf(stderr, "allreduce_bench: %d ranks, %lld bytes: %s\n", ranks,
                        (long long)bytes, a.ok ? err : "wrong result");
                return 1;
            }
            double busbw = bench_busbw(bytes, ranks, a.seconds);
            double copy = (double)bytes / bench_memcpy(bytes) / 1e9;
            char size[32];
            bench_size_text(size, sizeof size, bytes);
            printf("%8s %12.2f %12.2f %14.2f %8.2f\n", size, a.seconds * 1e6, busbw, copy,
                   busbw / copy);
            fflush(stdout);
        }
        printf("\n");
    }
    return 0;
}
