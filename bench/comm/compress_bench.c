/* compress_bench: time of one gradient reduction per mode of --compress (docs/comm.md),
 * against dmrt_allreduce_sum of the same gradients: the bytes saved on the wire, and what
 * compressing costs (rounding, selection, the factors' products) on this machine.
 *
 *   compress_bench [RANKS]                        threads backend (default 2 ranks)
 *   mpirun -np 2 compress_bench_mpi               MPI backend (built with -DBENCH_MPI)
 *
 * Two sets of gradients, each reduced as one bucket: examples/mlp.dm's (784 x 1024, 1024,
 * 1024 x 1024, 1024, 1024 x 10, 10: 7.1 MiB) and a 2048 x 2048 matrix with a vector of
 * 2048 (16 MiB). Each mode runs 5 batches of calls between barriers, timed on rank 0; the
 * table shows the best batch's time per call, and the bytes a rank sends by ring
 * algorithms (the formulas of docs/parallelism.md). */
#include <math.h>

#include "bench_common.h"
#include "dmrt_comm.h"

#ifdef BENCH_MPI
#define BACKEND "MPI"
#else
#define BACKEND "threads"
#endif

typedef struct tensor_shape {
    int64_t rows, cols; /* a vector: 1 x n */
} tensor_shape;

static const tensor_shape mlp_shapes[] = {{784, 1024}, {1, 1024}, {1024, 1024}, {1, 1024}, {1024, 10}, {1, 10}};
static const tensor_shape square_shapes[] = {{2048, 2048}, {1, 2048}};

typedef struct bench_case {
    const char *name;
    const tensor_shape *shapes;
    int n_shapes;
} bench_case;

typedef struct mode {
    const char *name;
    int kind;     /* 0 allreduce, 1 bf16, 2 fp16, 3 top-k, 4 PowerSGD */
    double ratio; /* top-k */
    int rank;     /* PowerSGD */
} mode;

static const mode modes[] = {{"allreduce", 0, 0, 0}, {"bf16", 1, 0, 0},        {"fp16", 2, 0, 0},       {"topk:0.01", 3, 0.01, 0},
                             {"topk:0.1", 3, 0.1, 0}, {"powersgd:4", 4, 0, 4}, {"powersgd:1", 4, 0, 1}};

/* The buffers of one case: the range (each tensor at a multiple of 16, as ctx->grads),
 * its segments for top-k and PowerSGD, residuals and factors. */
typedef struct bench_state {
    int64_t n, q_elems, work_elems;
    float *grads, *input, *residual, *q, *work;
    dmrt_topk_segment topk[8];
    dmrt_powersgd_segment psgd[8];
    int n_segs;
} bench_state;

static int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

static int setup(bench_state *s, const bench_case *bc, const mode *m, int ranks, int id) {
    memset(s, 0, sizeof *s);
    s->n_segs = bc->n_shapes;
    for (int k = 0; k < bc->n_shapes; k++) {
        int64_t rows = bc->shapes[k].rows, cols = bc->shapes[k].cols, count = rows * cols;
        int64_t keep = (int64_t)floor(m->ratio * (double)count + 0.5);
        s->topk[k] = (dmrt_topk_segment){s->n, count, keep < 1 ? 1 : keep};
        int squeezed = rows > 1 && m->rank * (rows + cols) < rows * cols;
        s->psgd[k] = (dmrt_powersgd_segment){s->n, squeezed ? rows : 1, squeezed ? cols : count, squeezed, (uint64_t)k};
        if (squeezed) s->q_elems += cols * m->rank;
        s->n += round16(count);
    }
    if (m->kind == 1 || m->kind == 2) s->work_elems = dmrt_allreduce_half_work(s->n, ranks);
    if (m->kind == 3) s->work_elems = dmrt_allreduce_topk_work(s->topk, s->n_segs, ranks);
    if (m->kind == 4) s->work_elems = dmrt_allreduce_powersgd_work(s->psgd, s->n_segs, m->rank);
    s->grads = calloc((size_t)s->n, sizeof(float));
    s->input = calloc((size_t)s->n, sizeof(float));
    s->residual = calloc((size_t)s->n, sizeof(float));
    s->q = calloc((size_t)(s->q_elems + 1), sizeof(float));
    s->work = calloc((size_t)(s->work_elems + 1), sizeof(float));
    if (!s->grads || !s->input || !s->residual || !s->q || !s->work) return 1;
    /* gradient-like values: small, of both signs, different on each rank */
    uint64_t z = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1);
    for (int64_t i = 0; i < s->n; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        s->input[i] = (float)((int64_t)(z >> 40) - (1 << 23)) * 1e-9f;
    }
    if (m->kind == 4) dmrt_powersgd_init(s->q, s->psgd, s->n_segs, m->rank, 0);
    return 0;
}

static void release(bench_state *s) {
    free(s->grads), free(s->input), free(s->residual), free(s->q), free(s->work);
}

static int reduce(dmrt_comm *c, bench_state *s, const mode *m, int64_t step) {
    memcpy(s->grads, s->input, (size_t)s->n * sizeof(float));
    switch (m->kind) {
    case 0: return dmrt_allreduce_sum(c, s->grads, s->n, "allreduce");
    case 1:
    case 2: return dmrt_allreduce_sum_half(c, s->grads, s->n, m->kind == 1 ? DMRT_BF16 : DMRT_FP16, s->work, s->work_elems, m->name);
    case 3: return dmrt_allreduce_topk(c, s->grads, s->residual, s->n, s->topk, s->n_segs, s->work, s->work_elems, m->name);
    default:
        return dmrt_allreduce_powersgd(c, s->grads, s->residual, s->q, s->n, s->psgd, s->n_segs, m->rank, 0, step, s->work,
                                       s->work_elems, m->name);
    }
}

/* Bytes a rank sends per call by ring algorithms (docs/parallelism.md's formulas). */
static double sent_bytes(const bench_state *s, const mode *m, int ranks) {
    double f = 2.0 * (ranks - 1) / ranks, total = 0;
    for (int k = 0; k < s->n_segs; k++) {
        double count = (double)s->topk[k].count;
        if (m->kind == 0) total += 4 * count * f;
        else if (m->kind <= 2) total += 2 * count * f;
        else if (m->kind == 3) total += 8.0 * (double)s->topk[k].k * (ranks - 1);
        else if (s->psgd[k].compressed) total += 4.0 * m->rank * (double)(s->psgd[k].rows + s->psgd[k].cols) * f;
        else total += 4 * count * f;
    }
    return total;
}

static int run_case(dmrt_rank *r, const bench_case *bc) {
    dmrt_comm *w = dmrt_rank_world(r);
    int ranks = dmrt_rank_count(r), id = dmrt_rank_id(r);
    double plain = 0;
    if (id == 0) printf("%s, %d ranks, %s:\n%12s %12s %10s %14s %10s\n", BACKEND, ranks, bc->name, "mode", "ms/call",
                        "vs fp32", "sent/rank", "less");
    for (size_t k = 0; k < sizeof modes / sizeof *modes; k++) {
        bench_state s;
        const mode *m = &modes[k];
        if (setup(&s, bc, m, ranks, id)) return 1;
        int iters = (int)(((int64_t)64 << 20) / (s.n * 4));
        iters = iters < 3 ? 3 : iters;
        double t[BENCH_BATCHES];
        int64_t step = 1;
        if (reduce(w, &s, m, step++)) return fprintf(stderr, "%s\n", dmrt_rank_error(r)), 1;
        for (int b = 0; b < BENCH_BATCHES; b++) {
            if (dmrt_barrier(w, "batch start")) return 1;
            double t0 = bench_now();
            for (int i = 0; i < iters; i++)
                if (reduce(w, &s, m, step++)) return fprintf(stderr, "%s\n", dmrt_rank_error(r)), 1;
            if (dmrt_barrier(w, "batch end")) return 1;
            t[b] = (bench_now() - t0) / iters;
        }
        double best = bench_best(t, BENCH_BATCHES), sent = sent_bytes(&s, m, ranks);
        if (k == 0) plain = best;
        if (id == 0)
            printf("%12s %12.3f %9.2fx %10.1f KiB %9.1fx\n", m->name, best * 1e3, plain / best, sent / 1024,
                   sent_bytes(&s, &modes[0], ranks) / sent);
        fflush(stdout);
        release(&s);
    }
    if (id == 0) printf("\n");
    return 0;
}

static int bench_rank(dmrt_rank *r, void *arg) {
    (void)arg;
    const bench_case cases[] = {{"examples/mlp.dm's gradients (7.1 MiB)", mlp_shapes, 6},
                                {"2048 x 2048 and 2048 (16 MiB)", square_shapes, 2}};
    for (int k = 0; k < 2; k++)
        if (run_case(r, &cases[k])) return 1;
    return 0;
}

int main(int argc, char **argv) {
    char err[1024];
#ifdef BENCH_MPI
    int rc = dmrt_mpi_run(&argc, &argv, bench_rank, NULL, err, sizeof err);
#else
    int ranks = argc > 1 ? atoi(argv[1]) : 2;
    int rc = dmrt_threads_run(ranks > 0 ? ranks : 2, bench_rank, NULL, err, sizeof err);
#endif
    if (rc) fprintf(stderr, "compress_bench: %s\n", err);
    return rc ? 1 : 0;
}
