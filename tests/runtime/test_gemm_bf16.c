/* test_gemm_bf16: the bf16 rounding helpers on hand-picked bit patterns, and
 * dmrt_gemm_bf16 / dmrt_gemm_bf16_split against a double-precision product of the same
 * bf16 values: every transpose, padded strides, beta 0 (C holding NaN, not to be read) and
 * 1, odd sizes. The path is the process's (DMRT_BF16_GEMM, set by tests/runtime/meson.build
 * per test): "onednn" where oneDNN cannot run here exits 77 (skipped). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

static float from_bits(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

static uint32_t to_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

static int check_rounding(void) {
    int fails = 0;
    static const struct {
        uint32_t in;
        uint16_t want;
        const char *why;
    } cases[] = {
        {0x3f800000u, 0x3f80, "1.0 is exact"},
        {0x3f807fffu, 0x3f80, "just under half an ulp rounds down"},
        {0x3f808001u, 0x3f81, "just over half an ulp rounds up"},
        {0x3f808000u, 0x3f80, "a tie goes to the even 0x3f80"},
        {0x3f818000u, 0x3f82, "a tie goes to the even 0x3f82, up"},
        {0xbf818000u, 0xbf82, "ties to even by magnitude for negatives"},
        {0x7f800000u, 0x7f80, "+inf stays +inf"},
        {0xff800000u, 0xff80, "-inf stays -inf"},
        {0x7f7f0000u, 0x7f7f, "the largest finite bf16 is exact"},
        {0x7f7f7fffu, 0x7f7f, "under the half-way point past it stays finite"},
        {0x7f7f8000u, 0x7f80, "the tie past the largest finite rounds to inf (even)"},
        {0x7f7fffffu, 0x7f80, "the largest finite float rounds to inf"},
        {0xff7fffffu, 0xff80, "and its negative to -inf"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0 keeps its sign"},
        {0x00008000u, 0x0000, "a subnormal tie goes to the even zero"},
        {0x00018000u, 0x0002, "a subnormal tie goes to the even 0x0002"},
        {0x00010001u, 0x0001, "subnormals are rounded, not flushed"},
        {0x807fffffu, 0x8080, "the largest subnormal rounds up to the smallest normal"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = dmrt_bf16_round(from_bits(cases[i].in));
        CHECK(got == cases[i].want, "round(0x%08x) = 0x%04x, want 0x%04x: %s", (unsigned)cases[i].in,
              (unsigned)got, (unsigned)cases[i].want, cases[i].why);
    }
    /* NaNs stay NaN (quiet, same sign), even with a payload only in the dropped bits,
     * which plain rounding would carry into inf */
    static const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fbfffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t got = dmrt_bf16_round(from_bits(nans[i]));
        CHECK((got & 0x7f80) == 0x7f80 && (got & 0x0040) != 0 && (got & 0x8000) == ((nans[i] >> 16) & 0x8000),
              "round(NaN 0x%08x) = 0x%04x, want a quiet NaN of the same sign", (unsigned)nans[i], (unsigned)got);
    }
    /* widening is exact: the bits land in the upper half */
    static const uint16_t halves[] = {0x3f80, 0xc000, 0x0001, 0x8001, 0x7f7f, 0x7f80, 0xff80, 0x7fc1};
    for (size_t i = 0; i < sizeof halves / sizeof halves[0]; i++) {
        uint32_t got = to_bits(dmrt_bf16_to_f32(halves[i]));
        CHECK(got == (uint32_t)halves[i] << 16, "to_f32(0x%04x) has bits 0x%08x", (unsigned)halves[i],
              (unsigned)got);
    }
    CHECK(dmrt_bf16_to_f32(0x3f80) == 1.0f && dmrt_bf16_to_f32(0xc000) == -2.0f, "1.0 and -2.0");
    /* the array forms are the scalar ones, element by element */
    float x[5] = {1.0f, from_bits(0x3f808000u), from_bits(0x3f818000u), -INFINITY, from_bits(0x00018000u)};
    uint16_t h[5];
    float back[5];
    dmrt_f32_to_bf16_array(x, h, 5);
    dmrt_bf16_to_f32_array(h, back, 5);
    for (int i = 0; i < 5; i++) {
        CHECK(h[i] == dmrt_bf16_round(x[i]), "array rounding of element %d", i);
        CHECK(to_bits(back[i]) == (uint32_t)h[i] << 16, "array widening of element %d", i);
    }
    return fails;
}

/* C = alpha op(A) op(B) + beta C in double over the bf16 values; beta == 0 reads no C.
 * sum_abs gets sum |a b| + |beta c| per element, the scale of the rounding errors. */
static void reference(int ta, int tb, int m, int n, int k, double alpha, const uint16_t *a, int lda,
                      const uint16_t *b, int ldb, double beta, const float *c0, double *want, double *sum_abs,
                      int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0.0, s_abs = 0.0;
            for (int p = 0; p < k; p++) {
                double x = dmrt_bf16_to_f32(ta ? a[p * lda + i] : a[i * lda + p]);
                double y = dmrt_bf16_to_f32(tb ? b[j * ldb + p] : b[p * ldb + j]);
                s += x * y;
                s_abs += fabs(x * y);
            }
            double old = beta == 0.0 ? 0.0 : beta * c0[i * ldc + j];
            want[i * ldc + j] = alpha * s + old;
            sum_abs[i * ldc + j] = fabs(alpha) * s_abs + fabs(old);
        }
}

/* fp32 accumulation of k products: each product of two bf16 is exact in fp32 (8 + 8
 * significand bits), each of the k sums and the final alpha/beta steps rounds by at most
 * 2^-24 relative to the running magnitude, so |error| <= (k + 2) 2^-24 sum|terms|; twice
 * that leaves room for blocked summation orders (oneDNN's, OpenBLAS's). */
static double tolerance(int k, double sum_abs) { return 2.0 * (k + 2) * ldexp(1.0, -24) * sum_abs + 1e-30; }

static int one(int split, int ta, int tb, int m, int n, int k, int pad, float alpha, float beta) {
    int fails = 0;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
    size_t na = (size_t)arows * lda + 1, nb = (size_t)brows * ldb + 1, nc = (size_t)m * ldc + 1;
    float *a32 = malloc(sizeof(float) * na), *b32 = malloc(sizeof(float) * nb);
    uint16_t *a = malloc(sizeof(uint16_t) * na), *b = malloc(sizeof(uint16_t) * nb);
    float *c = malloc(sizeof(float) * nc), *c0 = malloc(sizeof(float) * nc);
    double *want = malloc(sizeof(double) * nc), *sum_abs = malloc(sizeof(double) * nc);
    dmrt_rng rng;
    dmrt_rng_init(&rng, 7, (uint64_t)(((m * 131 + n) * 131 + k) * 8 + ta * 4 + tb * 2 + split));
    dmrt_fill_uniform(a32, (int64_t)na, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(b32, (int64_t)nb, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(c0, (int64_t)nc, -1.0f, 1.0f, &rng);
    dmrt_f32_to_bf16_array(a32, a, (int64_t)na);
    dmrt_f32_to_bf16_array(b32, b, (int64_t)nb);
    /* beta == 0: C must not be read, so it starts as NaN */
    for (size_t i = 0; i < nc; i++) c[i] = beta == 0.0f ? NAN : c0[i];
    reference(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, want, sum_abs, ldc);
    if (split)
        dmrt_gemm_bf16_split(2, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        dmrt_gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    int bad = 0;
    for (int i = 0; i < m && bad < 3; i++)
        for (int j = 0; j < n && bad < 3; j++) {
            double got = c[i * ldc + j], w = want[i * ldc + j], tol = tolerance(k, sum_abs[i * ldc + j]);
            if (!(fabs(got - w) <= tol)) {
                bad++;
                CHECK(0, "%s ta=%d tb=%d %dx%dx%d pad=%d alpha=%g beta=%g: C[%d,%d] = %.9g, want %.9g (tolerance %.3g)",
                      split ? "split" : "gemm", ta, tb, m, n, k, pad, alpha, beta, i, j, got, w, tol);
            }
        }
    /* the padding between C's rows is not written */
    for (int i = 0; i < m && pad > 0; i++)
        for (int j = n; j < ldc; j++)
            CHECK(beta == 0.0f ? isnan(c[i * ldc + j]) : c[i * ldc + j] == c0[i * ldc + j],
                  "C[%d,%d] in the padding was written", i, j);
    free(a32), free(b32), free(a), free(b), free(c), free(c0), free(want), free(sum_abs);
    return fails;
}

/* Operands whose bf16 rounding moves the product far beyond the tolerance: 1 + 3 2^-9
 * rounds to 1 + 2^-7, so k of them squared sum to k 1.01568 instead of k 1.01175. A product
 * that ran on the unrounded fp32 values (or rounded them otherwise) fails here. */
static int check_rounded_operands(int split) {
    int fails = 0;
    enum { M = 32, N = 48, K = 256 };
    static float a32[M * K], b32[K * N], c[M * N];
    static uint16_t a[M * K], b[K * N];
    float x = 1.0f + 3.0f * ldexpf(1.0f, -9);
    for (int i = 0; i < M * K; i++) a32[i] = x;
    for (int i = 0; i < K * N; i++) b32[i] = x;
    dmrt_f32_to_bf16_array(a32, a, M * K);
    dmrt_f32_to_bf16_array(b32, b, K * N);
    if (split)
        dmrt_gemm_bf16_split(2, 0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    else
        dmrt_gemm_bf16(0, 0, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
    double r = 1.0 + ldexp(1.0, -7);
    double rounded = K * r * r, unrounded = K * (double)x * (double)x, tol = tolerance(K, rounded);
    CHECK(fabs(rounded - unrounded) > 100 * tol, "the operands do not tell the two apart");
    for (int i = 0; i < M * N; i++)
        if (!(fabs(c[i] - rounded) <= tol)) {
            CHECK(0, "%s: C[%d] = %.9g, want %.9g (the product of the bf16 values; of the fp32 ones: %.9g)",
                  split ? "split" : "gemm", i, c[i], rounded, unrounded);
            break;
        }
    return fails;
}

/* dmrt_gemm_bf16_bias_split: bit for bit the fill-then-accumulate it replaces (every row
 * set to the bias, then dmrt_gemm_bf16_split with beta 1), within the product tolerance
 * of the exact sum, the padding between C's rows untouched; panels of rows, of columns,
 * and a product too small to split. */
static int bias_split(int threads, int ta, int tb, int m, int n, int k, int pad) {
    int fails = 0;
    int arows = ta ? k : m, acols = ta ? m : k, brows = tb ? n : k, bcols = tb ? k : n;
    int lda = acols + pad, ldb = bcols + pad, ldc = n + pad;
    size_t na = (size_t)arows * lda + 1, nb = (size_t)brows * ldb + 1, nc = (size_t)m * ldc;
    float *a32 = malloc(sizeof(float) * na), *b32 = malloc(sizeof(float) * nb), *bias = malloc(sizeof(float) * n);
    uint16_t *a = malloc(sizeof(uint16_t) * na), *b = malloc(sizeof(uint16_t) * nb);
    float *c = malloc(sizeof(float) * nc), *filled = malloc(sizeof(float) * nc);
    double *want = malloc(sizeof(double) * nc), *sum_abs = malloc(sizeof(double) * nc);
    dmrt_rng rng;
    dmrt_rng_init(&rng, 9, (uint64_t)(m * 7 + n * 3 + ta * 2 + tb));
    dmrt_fill_uniform(a32, (int64_t)na, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(b32, (int64_t)nb, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(bias, n, -1.0f, 1.0f, &rng);
    dmrt_f32_to_bf16_array(a32, a, (int64_t)na);
    dmrt_f32_to_bf16_array(b32, b, (int64_t)nb);
    for (size_t i = 0; i < nc; i++) c[i] = filled[i] = -7.0f;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) filled[i * ldc + j] = bias[j];
    reference(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 1.0f, filled, want, sum_abs, ldc);
    dmrt_gemm_bf16_split(threads, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, filled, ldc);
    dmrt_gemm_bf16_bias_split(threads, ta, tb, m, n, k, a, lda, b, ldb, bias, c, ldc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            int at = i * ldc + j;
            if (j >= n) {
                CHECK(c[at] == -7.0f, "bias_split %dx%dx%d pad=%d: padding C[%d][%d] written", m, n, k, pad, i, j);
                continue;
            }
            CHECK(c[at] == filled[at] && fabs(c[at] - want[at]) <= tolerance(k, sum_abs[at]),
                  "bias_split threads=%d ta=%d tb=%d %dx%dx%d pad=%d: C[%d][%d] = %.9g, fill + split %.9g, exact %.9g",
                  threads, ta, tb, m, n, k, pad, i, j, c[at], filled[at], want[at]);
        }
    free(a32), free(b32), free(bias), free(a), free(b), free(c), free(filled), free(want), free(sum_abs);
    return fails;
}

int main(void) {
    int fails = check_rounding();
    const char *forced = getenv("DMRT_BF16_GEMM");
    int onednn = dmrt_gemm_bf16_onednn_available();
    printf("oneDNN bf16 path available: %s\n", onednn ? "yes" : "no (no oneDNN in this build, or no AVX512-BF16)");
    if (forced && strcmp(forced, "onednn") == 0 && !onednn) {
        printf("DMRT_BF16_GEMM=onednn: skipped, the oneDNN path cannot run here\n");
        return fails ? 1 : 77;
    }
    printf("products run on: %s\n", dmrt_gemm_bf16_path());
    if (forced && strcmp(forced, "convert") == 0)
        CHECK(strcmp(dmrt_gemm_bf16_path(), "convert + OpenBLAS sgemm") == 0, "DMRT_BF16_GEMM=convert ignored");
    if (forced && strcmp(forced, "onednn") == 0)
        CHECK(strcmp(dmrt_gemm_bf16_path(), "oneDNN AVX512-BF16") == 0, "DMRT_BF16_GEMM=onednn ignored");

    static const int sizes[][3] = {{1, 1, 1}, {17, 33, 65}, {64, 320, 96}, {3, 200, 40}};
    for (int split = 0; split <= 1; split++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int ta = 0; ta <= 1; ta++)
                for (int tb = 0; tb <= 1; tb++)
                    for (int pad = 0; pad <= 3; pad += 3)
                        for (int beta = 0; beta <= 1; beta++)
                            fails += one(split, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], pad, 1.0f,
                                         (float)beta);
    /* the other alphas and betas, which the compiler does not emit, work too */
    fails += one(0, 1, 0, 17, 33, 65, 2, 0.5f, -0.25f);
    fails += one(1, 0, 1, 64, 320, 96, 1, -2.0f, 0.5f); /* past DMRT_SGEMM_SPLIT_MIN: split in panels */
    /* k == 0 scales C by beta */
    fails += one(0, 0, 0, 5, 7, 0, 1, 1.0f, 1.0f);
    fails += one(1, 0, 0, 5, 7, 0, 1, 1.0f, 0.0f);
    fails += check_rounded_operands(0);
    fails += check_rounded_operands(1);
    static const int bias_sizes[][3] = {{96, 40, 80}, {40, 96, 80}, {7, 5, 3}};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++)
            fails += bias_split(t < 2 ? 2 : 3, t & 1, t >> 1, bias_sizes[s][0], bias_sizes[s][1], bias_sizes[s][2],
                                3 * (s == 0));
    dmrt_gemm_bf16_release();
    /* products after a release build their state again */
    fails += one(0, 0, 1, 17, 33, 65, 0, 1.0f, 1.0f);
    dmrt_gemm_bf16_release();
    if (fails) fprintf(stderr, "%d check(s) failed\n", fails);
    else printf("all bf16 product checks passed\n");
    return fails ? 1 : 0;
}
