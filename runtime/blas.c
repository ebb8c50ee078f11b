/* blas.c: row-major SGEMM, a plain C reference and the OpenBLAS-backed one, and the
 * optional count of the time spent in it (DMRT_BLAS_TIME). */
#include "dmrt.h"
#include "internal.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Element (i, j) of op(X) for a row-major X with row stride ld. */
#define OPX(x, t, i, j, ld) ((t) ? (x)[(int64_t)(j) * (ld) + (i)] : (x)[(int64_t)(i) * (ld) + (j)])

void dmrt_sgemm_ref(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                    float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++)
                acc += (double)OPX(a, trans_a, i, p, lda) * (double)OPX(b, trans_b, p, j, ldb);
            float *cij = &c[i * ldc + j];
            /* beta == 0 means C is not read (it may hold NaN), as in BLAS. */
            *cij = alpha * (float)acc + (beta == 0.0f ? 0.0f : beta * *cij);
        }
    }
}

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

#ifdef _OPENMP
/* The ranks split their products themselves (dmrt_sgemm_split), each on cores of its own:
 * OpenBLAS's pool of threads, one per process, would run every rank's call on all cores
 * at once. Its setting is the process's, so it is made once, before the first call. */
static pthread_once_t blas_one_thread_once = PTHREAD_ONCE_INIT;
static void blas_one_thread(void) { openblas_set_num_threads(1); }
#define BLAS_READY() (void)pthread_once(&blas_one_thread_once, blas_one_thread)
#else
#define BLAS_READY() (void)0
#endif

static void sgemm_untimed(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc) {
    if (k <= 0 || alpha == 0.0f) {
        /* C = beta * C; BLAS implementations disagree on k == 0 and on lda there. */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(lda) || !fits_int(ldb) ||
        !fits_int(ldc)) {
        /* Beyond the 32-bit BLAS interface: fall back to the reference. */
        dmrt_sgemm_ref(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    BLAS_READY();
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda,
                b, (int)ldb, beta, c, (int)ldc);
}

/* -1 until DMRT_BLAS_TIME is read (once: a product then costs one predictable branch);
 * the counts are per thread, so that ranks on threads count their own products. */
static atomic_int blas_timing = -1;
static _Thread_local dmrt_blas_time blas_time;

int dmrt_blas_time_on(void) {
    int on = atomic_load_explicit(&blas_timing, memory_order_relaxed);
    if (on < 0) {
        const char *v = getenv("DMRT_BLAS_TIME");
        on = v && *v && strcmp(v, "0") != 0;
        atomic_store_explicit(&blas_timing, on, memory_order_relaxed);
    }
    return on;
}

dmrt_blas_time dmrt_blas_time_so_far(void) { return blas_time; }

void dmrt_blas_count_product(int64_t m, int64_t n, int64_t k, double t0) {
    blas_time.seconds += dmrt_now() - t0;
    blas_time.flops += 2.0 * (double)m * (double)n * (double)(k > 0 ? k : 0);
    blas_time.calls++;
}

void dmrt_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                float *c, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (!dmrt_blas_time_on()) {
        sgemm_untimed(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    double t0 = dmrt_now();
    sgemm_untimed(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    dmrt_blas_count_product(m, n, k, t0);
}

/* Where panel p of `panels` begins over `size` rows or columns; p == panels gives size. */
static int64_t panel_start(int64_t size, int p, int panels) {
    if (p >= panels) return size;
    return size * p / panels / 16 * 16;
}

dmrt_panel dmrt_sgemm_panel(int p, int panels, int trans_a, int trans_b, int64_t m, int64_t n, int64_t lda,
                            int64_t ldb, int64_t ldc) {
    int by_rows = m >= n;
    int64_t longer = by_rows ? m : n, first = panel_start(longer, p, panels),
            size = panel_start(longer, p + 1, panels) - first;
    if (by_rows) return (dmrt_panel){.m = size, .n = n, .a = trans_a ? first : first * lda, .c = first * ldc};
    return (dmrt_panel){.m = m, .n = size, .b = trans_b ? first * ldb : first, .c = first};
}

int dmrt_sgemm_panels(int threads, int64_t m, int64_t n, int64_t k) {
    int64_t longer = m >= n ? m : n;
    int panels = threads;
    if (panels > longer / 16) panels = (int)(longer / 16);
    if (panels <= 1 || (double)m * (double)n * (double)k < DMRT_SGEMM_SPLIT_MIN) return 1;
    return panels;
}

void dmrt_fill_bias_rows(int64_t m, int64_t n, const float *bias, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; i++) memcpy(c + i * ldc, bias, (size_t)n * sizeof(float));
}

/* The product in `panels` panels on the threads; with a bias, each panel's rows of C start
 * as its columns of the bias (a panel of columns starts at its first column, q.c < ldc;
 * one of rows at 0). Timed whole, by the calling thread: the panels run on other threads,
 * whose counts nobody reads. */
static void sgemm_panels(int panels, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta, const float *bias, float *c,
                         int64_t ldc) {
    double t0 = dmrt_blas_time_on() ? dmrt_now() : 0;
    DMRT_PARALLEL_FOR(panels)
    for (int p = 0; p < panels; p++) {
        dmrt_panel q = dmrt_sgemm_panel(p, panels, trans_a, trans_b, m, n, lda, ldb, ldc);
        if (bias) dmrt_fill_bias_rows(q.m, q.n, bias + q.c % ldc, c + q.c, ldc);
        sgemm_untimed(trans_a, trans_b, q.m, q.n, k, alpha, a + q.a, lda, b + q.b, ldb, beta, c + q.c, ldc);
    }
    if (dmrt_blas_time_on()) dmrt_blas_count_product(m, n, k, t0);
}

void dmrt_sgemm_split(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc) {
    int panels = dmrt_sgemm_panels(threads, m, n, k);
    if (panels <= 1) dmrt_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else sgemm_panels(panels, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, NULL, c, ldc);
}

void dmrt_sgemm_bias_split(int threads, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, const float *a,
                           int64_t lda, const float *b, int64_t ldb, const float *bias, float *c, int64_t ldc) {
    int panels = dmrt_sgemm_panels(threads, m, n, k);
    if (panels > 1) {
        sgemm_panels(panels, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, bias, c, ldc);
        return;
    }
    dmrt_fill_bias_rows(m, n, bias, c, ldc);
    dmrt_sgemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc);
}

/* Blocks of 64 columns on the threads, each column summed over the rows in order: the
 * bits one thread would get, whatever the count (the C target's loop of a bias's
 * gradient, codegen/dialect_c.c's reduce_columns, sums the same way). */
void dmrt_sum_rows_split(int threads, int64_t rows, int64_t cols, const float *x, int64_t ldx, float *out) {
    enum { BLOCK = 64 };
    const int64_t blocks = (cols + BLOCK - 1) / BLOCK;
    (void)threads;
    DMRT_PARALLEL_FOR(rows * cols >= DMRT_SGEMM_SPLIT_MIN && blocks > 1 ? threads : 1)
    for (int64_t block = 0; block < blocks; block++) {
        const int64_t first = block * BLOCK, end = first + BLOCK < cols ? first + BLOCK : cols;
        for (int64_t j = first; j < end; j++) out[j] = 0.0f;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = first; j < end; j++) out[j] += x[r * ldx + j];
    }
}

void dmrt_blas_share_cores(int ranks_here) {
#ifdef _OPENMP
    (void)ranks_here;
    BLAS_READY();
#else
    if (getenv("OPENBLAS_NUM_THREADS") || getenv("OMP_NUM_THREADS")) return;
    long cores = dmrt_cores();
    if (ranks_here < 1) return;
    long threads = cores / ranks_here;
    openblas_set_num_threads(threads < 1 ? 1 : (int)threads);
#endif
}
