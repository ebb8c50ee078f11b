/* test_sgemm: dmrt_sgemm (OpenBLAS) and dmrt_sgemm_ref against a naive triple loop,
 * every transpose combination, odd sizes, padded strides, and the empty cases;
 * dmrt_sgemm_bias_split and dmrt_sum_rows_split (below). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

/* C = alpha op(A) op(B) + beta C, in double. */
static void naive(int ta, int tb, int m, int n, int k, double alpha, const float *a, int lda,
                  const float *b, int ldb, double beta, double *c, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                double x = ta ? a[p * lda + i] : a[i * lda + p];
                double y = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += x * y;
            }
            c[i * ldc + j] = alpha * s + beta * c[i * ldc + j];
        }
}

static int one(int ta, int tb, int m, int n, int k, int pad, int use_ref) {
    int fails = 0;
    /* stored A is (m, k) or (k, m); padded row strides */
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
    float *a = malloc(sizeof(float) * (size_t)(arows * lda + 1));
    float *b = malloc(sizeof(float) * (size_t)(brows * ldb + 1));
    float *c = malloc(sizeof(float) * (size_t)(m * ldc + 1));
    double *want = malloc(sizeof(double) * (size_t)(m * ldc + 1));
    dmrt_rng rng;
    dmrt_rng_init(&rng, 42, (uint64_t)(ta * 2 + tb));
    dmrt_fill_uniform(a, arows * lda, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(b, brows * ldb, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(c, m * ldc, -1.0f, 1.0f, &rng);
    for (int i = 0; i < m * ldc; i++) want[i] = c[i];
    naive(ta, tb, m, n, k, 1.5, a, lda, b, ldb, 0.5, want, ldc);
    (use_ref ? dmrt_sgemm_ref : dmrt_sgemm)(ta, tb, m, n, k, 1.5f, a, lda, b, ldb, 0.5f, c, ldc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            double got = c[i * ldc + j], w = want[i * ldc + j];
            /* padding columns (j >= n) must be untouched: want holds their old value */
            CHECK(fabs(got - w) <= 1e-5 * (1.0 + fabs(w)),
                  "%s ta=%d tb=%d m=%d n=%d k=%d pad=%d: C[%d][%d] = %.9g, want %.9g",
                  use_ref ? "ref" : "blas", ta, tb, m, n, k, pad, i, j, got, w);
        }
    free(a);
    free(b);
    free(c);
    free(want);
    return fails;
}

static int empty_cases(void) {
    int fails = 0;
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 5, 6};
    float c[4] = {1, 2, 3, 4};
    /* m == 0, n == 0: C untouched */
    dmrt_sgemm(0, 0, 0, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    dmrt_sgemm(0, 0, 2, 0, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    CHECK(c[0] == 1 && c[1] == 2 && c[2] == 3 && c[3] == 4, "m or n == 0 changed C");
    /* k == 0: C = beta C */
    dmrt_sgemm(0, 0, 2, 2, 0, 1.0f, a, 0, b, 2, 2.0f, c, 2);
    CHECK(c[0] == 2 && c[1] == 4 && c[2] == 6 && c[3] == 8, "k == 0 should scale C by beta");
    /* beta == 0 clears NaN in C */
    c[0] = c[1] = c[2] = c[3] = NAN;
    dmrt_sgemm(0, 0, 2, 2, 0, 1.0f, a, 0, b, 2, 0.0f, c, 2);
    CHECK(c[0] == 0 && c[3] == 0, "k == 0, beta == 0 should zero C, got %g", (double)c[0]);
    c[0] = c[1] = c[2] = c[3] = NAN;
    dmrt_sgemm(0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
    CHECK(c[0] == 22 && c[1] == 28 && c[2] == 49 && c[3] == 64,
          "beta == 0 should ignore NaN in C: %g %g %g %g", (double)c[0], (double)c[1],
          (double)c[2], (double)c[3]);
    return fails;
}

/* dmrt_sgemm_bias_split: bias + op(A) op(B), against the naive sum within float noise, and
 * bit for bit the fill-then-accumulate it replaces (every row set to the bias, then
 * dmrt_sgemm_split with beta 1), the padding between C's rows untouched. Shapes split in
 * panels of rows (m >= n) and of columns, and one too small to split. */
static int bias_split(int threads, int ta, int tb, int m, int n, int k, int pad) {
    int fails = 0;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
    float *a = malloc(sizeof(float) * (size_t)(arows * lda + 1)), *b = malloc(sizeof(float) * (size_t)(brows * ldb + 1));
    float *bias = malloc(sizeof(float) * (size_t)n);
    float *c = malloc(sizeof(float) * (size_t)(m * ldc)), *filled = malloc(sizeof(float) * (size_t)(m * ldc));
    double *want = malloc(sizeof(double) * (size_t)(m * ldc));
    dmrt_rng rng;
    dmrt_rng_init(&rng, 43, (uint64_t)(m * 7 + n * 3 + ta * 2 + tb));
    dmrt_fill_uniform(a, arows * lda, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(b, brows * ldb, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(bias, n, -1.0f, 1.0f, &rng);
    for (int i = 0; i < m * ldc; i++) c[i] = filled[i] = -7.0f;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) filled[i * ldc + j] = bias[j], want[i * ldc + j] = bias[j];
    naive(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 1.0, want, ldc);
    dmrt_sgemm_split(threads, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, filled, ldc);
    dmrt_sgemm_bias_split(threads, ta, tb, m, n, k, a, lda, b, ldb, bias, c, ldc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            int at = i * ldc + j;
            if (j >= n) {
                CHECK(c[at] == -7.0f, "bias_split %dx%dx%d pad=%d: padding C[%d][%d] written", m, n, k, pad, i, j);
                continue;
            }
            CHECK(c[at] == filled[at] && fabs(c[at] - want[at]) <= 1e-5 * (1.0 + fabs(want[at])),
                  "bias_split threads=%d ta=%d tb=%d %dx%dx%d pad=%d: C[%d][%d] = %.9g, fill + split %.9g, naive %.9g",
                  threads, ta, tb, m, n, k, pad, i, j, c[at], filled[at], want[at]);
        }
    free(a), free(b), free(bias), free(c), free(filled), free(want);
    return fails;
}

/* dmrt_sum_rows_split: each column of x (rows ldx apart) summed over its rows, bit for bit
 * the C target's loop of a bias's gradient (out zeroed, then out[j] += x[r][j], r in
 * order) on any thread count, within float noise of a double sum; the padding is not read
 * into any sum (it holds NaN). Shapes over and under the threads' threshold. */
static int sum_rows(int threads, int rows, int cols, int pad) {
    int fails = 0, ldx = cols + pad;
    float *x = malloc(sizeof(float) * (size_t)(rows * ldx)), *out = malloc(sizeof(float) * (size_t)cols);
    float *loop = malloc(sizeof(float) * (size_t)cols);
    dmrt_rng rng;
    dmrt_rng_init(&rng, 47, (uint64_t)(rows * 5 + cols));
    dmrt_fill_uniform(x, rows * ldx, -1.0f, 1.0f, &rng);
    for (int r = 0; r < rows; r++)
        for (int j = cols; j < ldx; j++) x[r * ldx + j] = NAN;
    for (int j = 0; j < cols; j++) loop[j] = 0.0f, out[j] = 7.0f;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) loop[j] += x[r * ldx + j];
    dmrt_sum_rows_split(threads, rows, cols, x, ldx, out);
    for (int j = 0; j < cols; j++) {
        double want = 0;
        for (int r = 0; r < rows; r++) want += x[r * ldx + j];
        CHECK(out[j] == loop[j] && fabs(out[j] - want) <= 1e-6 * rows,
              "sum_rows threads=%d %dx%d pad=%d: column %d = %.9g, the loop %.9g, double %.9g", threads, rows, cols, pad, j,
              out[j], loop[j], want);
    }
    free(x), free(out), free(loop);
    return fails;
}

int main(void) {
    int fails = 0;
    static const int sum_sizes[][2] = {{2048, 200}, {1000, 64}, {3, 5}, {0, 4}};
    for (int s = 0; s < 4; s++)
        for (int threads = 1; threads <= 3; threads++) fails += sum_rows(threads, sum_sizes[s][0], sum_sizes[s][1], 3 * (s & 1));
    static const int bias_sizes[][3] = {{96, 40, 80}, {40, 96, 80}, {7, 5, 3}};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++)
            fails += bias_split(t < 2 ? 2 : 3, t & 1, t >> 1, bias_sizes[s][0], bias_sizes[s][1], bias_sizes[s][2], 3 * (s == 0));
    static const int sizes[][3] = {{7, 5, 3}, {1, 1, 1}, {13, 1, 9}, {1, 11, 5}, {65, 33, 17}};
    for (int s = 0; s < (int)(sizeof sizes / sizeof sizes[0]); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3)
                    for (int ref = 0; ref < 2; ref++)
                        fails += one(ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], pad, ref);
    fails += empty_cases();
    if (fails) fprintf(stderr, "test_sgemm: %d failures\n", fails);
    return fails != 0;
}
