/* test_gpu_quant.c: --quantize's GPU products (runtime/cuda/quant.cu) against the C
 * target's (runtime/gemm_quant.c, gemm_int8.c) on the same narrow weights and inputs:
 *
 *   dmrt_gpu_gemm_int8 (int8 activations): the output bit for bit dmrt_gemm_i8_split's
 *     (exact int32 sums, the same rounded float operations), beta 0 and 1, a padded lda,
 *     on shapes cuBLAS's int8 GEMM takes (multiples of 4) and on odd ones (the plain kernel);
 *   dmrt_gpu_gemm_wq (int8 and int4 weights, groups of 16 and 64 rows): the widened weight
 *     bit for bit dmrt_dequantize_rows's, the product within 1e-5 relative of
 *     dmrt_gemm_wq_split's (cuBLAS and OpenBLAS order the sums differently).
 *
 * Without a CUDA device prints SKIP and exits 77 (meson: skipped). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_cuda.h"
#include "gpu_test.h"

static int failures;


static float *random_floats(int64_t n, uint64_t seed, float scale) {
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    if (!p) abort();
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = scale * ((float)(seed >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
    }
    return p;
}


/* got against want, n values: bit for bit (rtol < 0) or within rtol of max |want|. */
static void compare(const char *what, const float *got, const float *want, int64_t n, double rtol) {
    double largest = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) largest = fmax(largest, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        if (rtol < 0 && memcmp(&got[i], &want[i], sizeof *got) != 0) {
            printf("FAIL %s: element %lld is %.9g, the C target's %.9g\n", what, (long long)i, got[i], want[i]);
            failures++;
            return;
        }
        double d = fabs((double)got[i] - want[i]);
        worst = d == d ? fmax(worst, d) : INFINITY; /* a NaN is off by everything, not skipped */
    }
    if (rtol >= 0 && worst > rtol * largest) {
        printf("FAIL %s: off by %.3g, more than %.0e of the largest %.3g\n", what, worst, rtol, largest);
        failures++;
    }
}

/* One product C (m, n) = A (m, k; row stride lda) W (k, n) (+ C when beta is 1) on both
 * targets from the same narrow weight q (its device copy made here). */
static void product_case(dmrt_gpu *g, int bits, int64_t m, int64_t k, int64_t n, int64_t lda, int64_t group, float beta,
                         int activations) {
    char what[160];
    snprintf(what, sizeof what, "%s bits %d, %lld x %lld x %lld, lda %lld, group %lld, beta %g",
             activations ? "int8 x int8" : "widened", bits, (long long)m, (long long)k, (long long)n, (long long)lda,
             (long long)group, (double)beta);
    dmrt_qweight q;
    if (dmrt_qweight_init(&q, bits, k, n, group) != 0) abort();
    float *w = random_floats(k * n, 1, 0.5f), *a = random_floats(m * lda, 2, 3.0f), *c0 = random_floats(m * n, 3, 1.0f);
    dmrt_quantize_weight(&q, w);
    q.input_scale = activations ? 3.0f / 127.0f * 0.8f : 0.0f; /* some |x| past the range: clamped */
    q.quantize_input = activations;
    uint8_t *data = on_device(g, q.data, (size_t)dmrt_qweight_bytes(&q));
    float *scale = on_device(g, q.scale, (size_t)(dmrt_qweight_groups(&q) * n) * sizeof(float));
    float *da = on_device(g, a, (size_t)(m * lda) * sizeof(float)), *dc = on_device(g, c0, (size_t)(m * n) * sizeof(float));
    float *dw = on_device(g, w, (size_t)(k * n) * sizeof(float)), *want = malloc((size_t)(m * n) * sizeof(float));
    float *got = malloc((size_t)(m * n) * sizeof(float)), *widened = malloc((size_t)(k * n) * sizeof(float));
    if (!want || !got || !widened) abort();
    memcpy(want, c0, (size_t)(m * n) * sizeof(float));
    if (activations) {
        void *work = NULL;
        GPU_CALL(g, dmrt_gpu_alloc(g, &work, (size_t)dmrt_cuda_quant_work_bytes(1, m, k, n)));
        GPU_CALL(g, dmrt_gpu_gemm_i8(g, &q, data, scale, dw, work, m, da, lda, beta, dc, n));
        dmrt_gemm_i8_split(1, &q, w, m, a, lda, beta, want, n);
        to_host(g, got, dc, (size_t)(m * n) * sizeof(float));
        compare(what, got, want, m * n, -1.0);
        dmrt_gpu_free(g, work);
    } else {
        GPU_CALL(g, dmrt_gpu_gemm_wq(g, &q, data, scale, dw, m, da, lda, beta, dc, n));
        dmrt_gemm_wq_split(1, &q, m, a, lda, beta, want, n);
        to_host(g, got, dc, (size_t)(m * n) * sizeof(float));
        compare(what, got, want, m * n, 1e-5);
        to_host(g, widened, dw, (size_t)(k * n) * sizeof(float));
        dmrt_dequantize_rows(&q, 0, k, w);
        snprintf(what + strlen(what), sizeof what - strlen(what), ": the widened weight");
        compare(what, widened, w, k * n, -1.0);
    }
    dmrt_gpu_free(g, data), dmrt_gpu_free(g, scale), dmrt_gpu_free(g, da), dmrt_gpu_free(g, dc), dmrt_gpu_free(g, dw);
    free(w), free(a), free(c0), free(want), free(got), free(widened);
    dmrt_qweight_free(&q);
}

int main(void) {
    dmrt_gpu *g = gpu_test_open();
    for (int beta = 0; beta <= 1; beta++) {
        product_case(g, 8, 16, 64, 32, 64, 64, (float)beta, 1);   /* cuBLAS's int8 GEMM */
        product_case(g, 8, 256, 128, 512, 128, 128, (float)beta, 1);
        product_case(g, 8, 5, 63, 10, 70, 63, (float)beta, 1);    /* odd: the plain kernel */
        product_case(g, 8, 16, 784, 63, 784, 784, (float)beta, 1);
        product_case(g, 8, 7, 48, 33, 50, 48, (float)beta, 0);
        product_case(g, 4, 7, 48, 33, 50, 16, (float)beta, 0);    /* int4, odd width, groups of 16 */
        product_case(g, 4, 16, 130, 64, 130, 64, (float)beta, 0); /* a short last group */
    }
    dmrt_gpu_destroy(g);
    printf("%s: %d failed checks\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
