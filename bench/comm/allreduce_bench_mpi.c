/* allreduce_bench_mpi: Open MPI's MPI_Allreduce (MPI_SUM, in place, on MPI_COMM_WORLD)
 * and dmrt_comm's MPI backend allreduce (ordered sums: alltoallv, local sum,
 * allgatherv), 1 KiB to 64 MiB, next to single-thread memcpy (docs/comm.md).
 *
 *   mpirun -np 2 allreduce_bench_mpi
 *
 * Same method as allreduce_bench: 5 batches of about 256 MiB each between barriers,
 * timed on rank 0, best batch; bus bandwidth 2 (n - 1) / n * bytes / time. */
#include <mpi.h>

#include "bench_common.h"
#include "dmrt_comm.h"

#define MPI_CHECK(expr)                                                                 \
    do {                                                                                \
        int rc_ = (expr);                                                               \
        if (rc_ != MPI_SUCCESS) {                                                       \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #expr, rc_); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

/* Best seconds per allreduce of `bytes`; with use_mpi, MPI_Allreduce, else dmrt's. */
static int time_allreduce(dmrt_rank *r, int use_mpi, int64_t bytes, double *seconds) {
    dmrt_comm *w = dmrt_rank_world(r);
    int n = (int)(bytes / (int64_t)sizeof(float));
    int ranks = dmrt_rank_count(r), id = dmrt_rank_id(r);
    float *buf = malloc((size_t)bytes);
    if (!buf) return 1;
    for (int i = 0; i < n; i++) buf[i] = (float)(id + 1);
    if (use_mpi)
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    else if (dmrt_allreduce_sum(w, buf, n, "check"))
        return fprintf(stderr, "%s\n", dmrt_rank_error(r)), 1;
    for (int i = 0; i < n; i++)
        if (buf[i] != (float)(ranks * (ranks + 1) / 2))
            return fprintf(stderr, "wrong allreduce result at %d: %g\n", i, buf[i]), 1;
    memset(buf, 0, (size_t)bytes);
    int iters = bench_iters(bytes);
    double t[BENCH_BATCHES];
    for (int b = 0; b < BENCH_BATCHES; b++) {
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = bench_now();
        for (int i = 0; i < iters; i++) {
            if (use_mpi)
                MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
            else if (dmrt_allreduce_sum(w, buf, n, "bench"))
                return fprintf(stderr, "%s\n", dmrt_rank_error(r)), 1;
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        t[b] = (bench_now() - t0) / iters;
    }
    free(buf);
    *seconds = bench_best(t, BENCH_BATCHES);
    return 0;
}

static int bench_rank(dmrt_rank *r, void *arg) {
    (void)arg;
    int ranks = dmrt_rank_count(r), id = dmrt_rank_id(r);
    if (id == 0) {
        printf("MPI, %d processes: in-place allreduce (best of %d batches)\n", ranks,
               BENCH_BATCHES);
        printf("%8s %12s %12s %12s %12s %14s %8s %8s\n", "size", "MPI us", "MPI GB/s",
               "dmrt us", "dmrt GB/s", "memcpy GB/s", "MPI/cp", "dmrt/cp");
    }
    for (int64_t bytes = BENCH_MIN_BYTES; bytes <= BENCH_MAX_BYTES; bytes *= 4) {
        double t_mpi, t_dmrt;
        if (time_allreduce(r, 1, bytes, &t_mpi) || time_allreduce(r, 0, bytes, &t_dmrt)) return 1;
        if (id == 0) {
            double copy = (double)bytes / bench_memcpy(bytes) / 1e9;
            double bw_mpi = bench_busbw(bytes, ranks, t_mpi), bw_dmrt = bench_busbw(bytes, ranks, t_dmrt);
            char size[32];
            bench_size_text(size, sizeof size, bytes);
            printf("%8s %12.2f %12.2f %12.2f %12.2f %14.2f %8.2f %8.2f\n", size, t_mpi * 1e6,
                   bw_mpi, t_dmrt * 1e6, bw_dmrt, copy, bw_mpi / copy, bw_dmrt / copy);
            fflush(stdout);
        }
        /* The others wait while rank 0 measures memcpy alone. */
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    return 0;
}

int main(int argc, char **argv) {
    char err[1024];
    int rc = dmrt_mpi_run(&argc, &argv, bench_rank, NULL, err, sizeof err);
    if (rc) fprintf(stderr, "allreduce_bench_mpi: %s\n", err);
    return rc ? 1 : 0;
}
