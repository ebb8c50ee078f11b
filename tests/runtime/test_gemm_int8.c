/* test_gemm_int8: --quantize int8's products (runtime/gemm_int8.c). The activations'
 * quantization on hand-picked values (ties to even, the clamp to [-127, 127]); the int32
 * accumulations of dmrt_gemm_s8s8s32 bit for bit against a plain int64 sum, on random and
 * extreme operands (all +-127: the sums that saturate int8 dot products without VNNI);
 * dmrt_gemm_i8_split's f32 output bit for bit against the documented formula, beta 0 (C
 * holding NaN, not read) and 1, padded strides, on 1 and 3 threads. The path is the
 * process's (DMRT_INT8_GEMM, set per test by tests/runtime/meson.build): "onednn" where it
 * cannot run here exits 77 (skipped). dmrt_gemm_i8_window_split of a window of the
 * weight's columns (gpt.dm's q, k, v of [C, 3C], and an odd one) against the same formula. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static int8_t random_q(void) { return (int8_t)((int)(next_u32() % 255) - 127); }
static float random_f(float amplitude) { return amplitude * ((float)(next_u32() % 2000001) / 1000000.0f - 1.0f); }

static int check_activation_rounding(void) {
    int fails = 0;
    static const struct {
        float x;
        int8_t want;
        const char *why;
    } cases[] = {
        {0.25f, 0, "0.5 ties to the even 0"},     {0.75f, 2, "1.5 ties to the even 2"},
        {-0.75f, -2, "-1.5 ties to -2"},          {1.2f, 2, "2.4 rounds to 2"},
        {63.25f, 126, "126.5 ties to 126"},       {63.75f, 127, "127.5 clamps to 127"},
        {-63.75f, -127, "-127.5 clamps to -127"}, {1e6f, 127, "large clamps to 127"},
        {-1e6f, -127, "never -128"},              {0.0f, 0, "0"},
        {INFINITY, 127, "inf clamps to 127"},     {NAN, 0, "NaN is 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int8_t q;
        dmrt_quantize_activations(&cases[i].x, 1, 0.5f, &q);
        CHECK(q == cases[i].want, "quantize(%g / 0.5) = %d, want %d: %s", (double)cases[i].x, q, cases[i].want,
              cases[i].why);
    }
    return fails;
}

/* fill: 0 random, 1 all qa 127 and qw 127, 2 qa -127 and qw alternating 127 / -127 */
static int check_accumulations(int64_t m, int64_t n, int64_t k, int fill, int want_onednn) {
    int fails = 0;
    int8_t *qa = malloc((size_t)(m * k)), *qw = malloc((size_t)(k * n));
    int32_t *acc = malloc((size_t)(m * n) * sizeof *acc);
    if (!qa || !qw || !acc) abort();
    for (int64_t i = 0; i < m * k; i++) qa[i] = fill == 0 ? random_q() : fill == 1 ? 127 : -127;
    for (int64_t i = 0; i < k * n; i++) qw[i] = fill == 0 ? random_q() : fill == 1 || i % 2 ? 127 : -127;
    int onednn = dmrt_gemm_s8s8s32(m, n, k, qa, qw, acc);
    CHECK(onednn == want_onednn, "%lld x %lld x %lld ran on %s", (long long)m, (long long)n, (long long)k,
          onednn ? "oneDNN" : "plain C");
    for (int64_t i = 0; i < m && !fails; i++)
        for (int64_t j = 0; j < n && !fails; j++) {
            int64_t want = 0;
            for (int64_t p = 0; p < k; p++) want += (int64_t)qa[i * k + p] * qw[p * n + j];
            CHECK(acc[i * n + j] == want, "%lld x %lld x %lld (fill %d): acc[%lld, %lld] = %d, want %lld", (long long)m,
                  (long long)n, (long long)k, fill, (long long)i, (long long)j, acc[i * n + j], (long long)want);
        }
    free(qa), free(qw), free(acc);
    return fails;
}

/* dmrt_gemm_i8_split against: q_x = clamp(round(x / s_x)), acc in int64, then
 * (float)acc * (s_x * s_w[j]) (+ C). cols > 0: dmrt_gemm_i8_window_split of the weight's
 * columns [col0, col0 + cols) alone, against the same formula of those columns (C is
 * m x cols). */
static int check_product(int threads, int64_t m, int64_t n, int64_t k, int64_t pad, float beta, int64_t col0,
                         int64_t cols) {
    int fails = 0;
    const int64_t all = n; /* the weight's columns; n: those the product makes */
    if (cols > 0) n = cols;
    else col0 = 0;
    int64_t lda = k + pad, ldc = n + pad;
    float *w = malloc((size_t)(k * all) * sizeof *w), *a = malloc((size_t)(m * lda) * sizeof *a);
    float *c = malloc((size_t)(m * ldc) * sizeof *c), *c0 = malloc((size_t)(m * ldc) * sizeof *c0);
    int8_t *qx = malloc((size_t)k);
    dmrt_qweight q;
    if (!w || !a || !c || !c0 || !qx || dmrt_qweight_init(&q, 8, k, all, k) != 0) abort();
    for (int64_t i = 0; i < k * all; i++) w[i] = random_f(0.1f);
    for (int64_t i = 0; i < m * lda; i++) a[i] = random_f(3.0f);
    for (int64_t i = 0; i < m * ldc; i++) c0[i] = c[i] = beta == 0.0f ? NAN : random_f(1.0f);
    dmrt_quantize_weight(&q, w);
    q.quantize_input = 1;
    q.input_scale = 2.5f / 127.0f; /* some |x| past 2.5 clamp */
    if (cols > 0) dmrt_gemm_i8_window_split(threads, &q, w + col0, col0, cols, m, a, lda, beta, c, ldc);
    else dmrt_gemm_i8_split(threads, &q, w, m, a, lda, beta, c, ldc);
    for (int64_t i = 0; i < m && !fails; i++) {
        for (int64_t p = 0; p < k; p++) {
            float v = nearbyintf(a[i * lda + p] / q.input_scale);
            qx[p] = (int8_t)(v > 127.0f ? 127 : v < -127.0f ? -127 : v);
        }
        for (int64_t j = 0; j < n && !fails; j++) {
            int64_t acc = 0;
            for (int64_t p = 0; p < k; p++) acc += (int64_t)qx[p] * ((const int8_t *)q.data)[p * all + col0 + j];
            float want = (float)acc * (q.input_scale * q.scale[col0 + j]);
            if (beta != 0.0f) want = c0[i * ldc + j] + want;
            CHECK(memcmp(&want, &c[i * ldc + j], sizeof want) == 0,
                  "threads %d, %lld x %lld x %lld (columns from %lld of %lld), beta %g: C[%lld, %lld] = %.9g, want %.9g",
                  threads, (long long)m, (long long)n, (long long)k, (long long)col0, (long long)all, (double)beta,
                  (long long)i, (long long)j, (double)c[i * ldc + j], (double)want);
        }
        for (int64_t j = n; j < ldc && !fails; j++) /* the padding is not written */
            CHECK(memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof *c) == 0, "C[%lld, %lld] past n was written",
                  (long long)i, (long long)j);
    }
    dmrt_qweight_free(&q);
    free(w), free(a), free(c), free(c0), free(qx);
    return fails;
}

int main(void) {
    int fails = check_activation_rounding();
    const char *forced = getenv("DMRT_INT8_GEMM");
    int onednn = dmrt_gemm_i8_onednn_available();
    printf("oneDNN int8 path available: %s\n", onednn ? "yes" : "no (no oneDNN in this build, or no AVX512-VNNI)");
    if (forced && strcmp(forced, "onednn") == 0 && !onednn) {
        printf("DMRT_INT8_GEMM=onednn: skipped, the oneDNN path cannot run here\n");
        return fails ? 1 : 77;
    }
    printf("products run on: %s\n", dmrt_gemm_i8_path());
    int want_onednn = strcmp(dmrt_gemm_i8_path(), "plain C") != 0;
    if (forced && strcmp(forced, "c") == 0) CHECK(!want_onednn, "DMRT_INT8_GEMM=c ignored");
    if (forced && strcmp(forced, "onednn") == 0) CHECK(want_onednn, "DMRT_INT8_GEMM=onednn ignored");
    static const int sizes[][3] = {{1, 1, 1}, {17, 33, 65}, {128, 64, 784}, {3, 10, 2000}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int fill = 0; fill < 3; fill++)
            fails += check_accumulations(sizes[s][0], sizes[s][1], sizes[s][2], fill, want_onednn);
    for (int threads = 1; threads <= 3; threads += 2)
        for (int pad = 0; pad <= 3; pad += 3)
            for (int beta = 0; beta <= 1; beta++) {
                fails += check_product(threads, 17, 33, 65, pad, (float)beta, 0, 0);
                fails += check_product(threads, 40, 10, 300, pad, (float)beta, 0, 0);
                /* windows: gpt.dm's q, k, v of a [C, 3C] weight, and an odd one */
                for (int part = 0; part < 3; part++)
                    fails += check_product(threads, 9, 3 * 16, 16, pad, (float)beta, part * 16, 16);
                fails += check_product(threads, 5, 33, 20, pad, (float)beta, 7, 11);
            }
    if (fails) fprintf(stderr, "%d check(s) failed\n", fails);
    else printf("all int8 product checks passed\n");
    return fails ? 1 : 0;
}
