/* test_gpu_quant.c: --quantize's GPU products (runtime/cuda/quant.cu) against the C
 * target's (runtime/gemm_quant.c, gemm_int8.c) on the same narrow weights and inputs:
 *
 *   dmrt_gpu_gemm_int8 (int8 activations): the output bit for bit dmrt_gemm_i8_split's
 *     (exact int32 sums, the same rounded float operations), beta 0 and 1, a padded lda,
 *     on shapes cuBLAS's int8 GEMM takes (multiples of 4) and on odd ones (the plain kernel);
 *   dmrt_gpu_gemm_wq and _window (int8 and int4 weights, groups of 16 and 64 rows; the
 *     whole weight, a window of its columns, a weight read transposed, and one over 16 MiB
 *     in f32 widened a block of columns at a time): the widened columns in the work buffer
 *     bit for bit dmrt_dequantize_rows's, the product within 1e-5 relative of
 *     dmrt_gemm_wq_window_split's (cuBLAS and OpenBLAS order the sums differently);
 *   dmrt_gpu_embed_narrow (--quantize-embeddings, int8 and int4, an odd vocabulary): the
 *     rows bit for bit dmrt_qweight_gather_rows's; a bad id recorded as the fault (its
 *     site, value and position) with a zero row, the good rows still gathered.
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

/* The weight-only product of columns [col0, col0 + cols) of q (narrow, its integers and
 * scales at data and scale on the device) with A (m rows, row stride lda: a on the host, da
 * on the device) into C (m, cols; row stride ldc, c0 its values before, dc on the device)
 * on both targets; then the work buffer's last block of widened columns against
 * dmrt_dequantize_rows's values of those columns, bit for bit. */
static void widen_check(dmrt_gpu *g, const char *what, const dmrt_qweight *q, const uint8_t *data, const float *scale,
                        int64_t col0, int64_t cols, int64_t m, const float *da, const float *a, int64_t lda, float beta,
                        float *dc, const float *c0, int64_t ldc) {
    char label[256];
    const int64_t k = q->rows, step = dmrt_qweight_widen_cols(k, cols), last = (cols - 1) / step * step;
    const int64_t block = cols - last;
    void *work = NULL;
    float *want = malloc((size_t)(m * ldc) * sizeof(float)), *got = malloc((size_t)(m * ldc) * sizeof(float));
    float *widened = malloc((size_t)(k * block) * sizeof(float)), *rows = malloc((size_t)(k * q->cols) * sizeof(float));
    float *expect = malloc((size_t)(k * block) * sizeof(float));
    if (!want || !got || !widened || !rows || !expect) abort();
    memcpy(want, c0, (size_t)(m * ldc) * sizeof(float));
    GPU_CALL(g, dmrt_gpu_alloc(g, &work, (size_t)dmrt_cuda_quant_work_bytes(0, m, k, cols)));
    GPU_CALL(g, dmrt_gpu_gemm_wq_window(g, q, data, scale, work, col0, cols, m, da, lda, beta, dc, ldc));
    dmrt_gemm_wq_window_split(1, q, col0, cols, m, a, lda, beta, want, ldc);
    to_host(g, got, dc, (size_t)(m * ldc) * sizeof(float));
    snprintf(label, sizeof label, "%s, columns %lld to %lld%s", what, (long long)col0, (long long)(col0 + cols),
             q->transposed ? ", read transposed" : "");
    compare(label, got, want, m * ldc, 1e-5);
    to_host(g, widened, work, (size_t)(k * block) * sizeof(float));
    dmrt_dequantize_rows(q, 0, k, rows);
    for (int64_t r = 0; r < k; r++)
        memcpy(expect + r * block, rows + r * q->cols + col0 + last, (size_t)block * sizeof(float));
    snprintf(label + strlen(label), sizeof label - strlen(label), ": the widened columns %lld to %lld",
             (long long)(col0 + last), (long long)(col0 + cols));
    compare(label, widened, expect, k * block, -1.0);
    dmrt_gpu_free(g, work);
    free(want), free(got), free(widened), free(rows), free(expect);
}

/* A weight-only product of a window of a [k, n] weight's columns (or of a weight read
 * transposed: the whole, W given as [n, k]), on both targets. */
static void window_case(dmrt_gpu *g, int bits, int64_t m, int64_t k, int64_t n, int64_t group, int64_t col0,
                        int64_t cols, int transposed, float beta) {
    char what[160];
    snprintf(what, sizeof what, "widened bits %d, %lld x %lld x %lld, group %lld, beta %g", bits, (long long)m,
             (long long)k, (long long)n, (long long)group, (double)beta);
    dmrt_qweight q;
    if (dmrt_qweight_init(&q, bits, k, n, group) != 0) abort();
    q.transposed = transposed;
    float *w = random_floats(k * n, 4, 0.5f), *a = random_floats(m * k, 5, 3.0f), *c0 = random_floats(m * cols, 6, 1.0f);
    dmrt_quantize_weight(&q, w);
    uint8_t *data = on_device(g, q.data, (size_t)dmrt_qweight_bytes(&q));
    float *scale = on_device(g, q.scale, (size_t)(dmrt_qweight_groups(&q) * n) * sizeof(float));
    float *da = on_device(g, a, (size_t)(m * k) * sizeof(float)), *dc = on_device(g, c0, (size_t)(m * cols) * sizeof(float));
    widen_check(g, what, &q, data, scale, col0, cols, m, da, a, k, beta, dc, c0, cols);
    dmrt_gpu_free(g, data), dmrt_gpu_free(g, scale), dmrt_gpu_free(g, da), dmrt_gpu_free(g, dc);
    free(w), free(a), free(c0);
    dmrt_qweight_free(&q);
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
    float *got = malloc((size_t)(m * n) * sizeof(float));
    if (!want || !got) abort();
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
        widen_check(g, what, &q, data, scale, 0, n, m, da, a, lda, beta, dc, c0, n);
    }
    dmrt_gpu_free(g, data), dmrt_gpu_free(g, scale), dmrt_gpu_free(g, da), dmrt_gpu_free(g, dc), dmrt_gpu_free(g, dw);
    free(w), free(a), free(c0), free(want), free(got);
    dmrt_qweight_free(&q);
}

/* The rows of a [vocab, width] table held narrow (q: its transpose, [width, vocab]) at
 * `rows` ids on both targets; bad: ids 2 and 5 out of the vocabulary (-1 and vocab). */
static void embed_case(dmrt_gpu *g, int bits, int64_t width, int64_t vocab, int64_t group, int64_t rows, int bad) {
    char what[128];
    snprintf(what, sizeof what, "embed_narrow bits %d, [%lld, %lld] table, group %lld, %lld ids%s", bits,
             (long long)vocab, (long long)width, (long long)group, (long long)rows, bad ? ", 2 bad" : "");
    dmrt_qweight q;
    if (dmrt_qweight_init(&q, bits, width, vocab, group) != 0) abort();
    q.transposed = 1;
    float *table = random_floats(vocab * width, 7, 0.5f);
    dmrt_quantize_weight(&q, table); /* table is the parameter, [vocab, width] */
    int32_t *ids = malloc((size_t)rows * sizeof *ids);
    float *want = calloc((size_t)(rows * width), sizeof(float)), *got = malloc((size_t)(rows * width) * sizeof(float));
    if (!ids || !want || !got) abort();
    for (int64_t r = 0; r < rows; r++) ids[r] = (int32_t)((r * 7 + 3) % vocab);
    if (bad) ids[2] = -1, ids[5] = (int32_t)vocab;
    for (int64_t r = 0; r < rows; r++)
        if (ids[r] >= 0 && ids[r] < vocab) dmrt_qweight_gather_rows(&q, ids + r, 1, want + r * width);
    uint8_t *data = on_device(g, q.data, (size_t)dmrt_qweight_bytes(&q));
    float *scale = on_device(g, q.scale, (size_t)(dmrt_qweight_groups(&q) * vocab) * sizeof(float));
    int32_t *dids = on_device(g, ids, (size_t)rows * sizeof *ids);
    memset(got, 0xff, (size_t)(rows * width) * sizeof(float)); /* NaNs: every row must be written, bad ones 0 */
    float *dout = on_device(g, got, (size_t)(rows * width) * sizeof(float));
    GPU_CALL(g, dmrt_gpu_embed_narrow(g, &q, data, scale, dids, dout, rows, 9, 100));
    to_host(g, got, dout, (size_t)(rows * width) * sizeof(float));
    compare(what, got, want, rows * width, -1.0);
    dmrt_fault f;
    GPU_CALL(g, dmrt_gpu_fault_take(g, &f));
    int fault_ok = bad ? f.site == 9 && (f.position == 102 || f.position == 105) && f.value == ids[f.position - 100]
                       : f.site == 0;
    if (!fault_ok) {
        printf("FAIL %s: fault site %d value %d position %lld\n", what, f.site, f.value, (long long)f.position);
        failures++;
    }
    dmrt_gpu_free(g, data), dmrt_gpu_free(g, scale), dmrt_gpu_free(g, dids), dmrt_gpu_free(g, dout);
    free(table), free(ids), free(want), free(got);
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
        window_case(g, 8, 9, 40, 96, 40, 32, 32, 0, (float)beta);   /* gpt.dm's k of c_attn */
        window_case(g, 4, 9, 40, 97, 16, 65, 32, 0, (float)beta);   /* int4: a window from an odd column */
        window_case(g, 8, 5, 24, 40, 24, 0, 40, 1, (float)beta);    /* read transposed */
        window_case(g, 4, 5, 24, 41, 8, 0, 41, 1, (float)beta);
    }
    /* over 16 MiB in f32: 65536 columns of the 64 rows widened at a time, then a short block */
    window_case(g, 8, 3, 64, 65600 + 37, 64, 0, 65600 + 37, 0, 1.0f);
    window_case(g, 4, 3, 64, 65600 + 100, 32, 50, 65600 + 37, 0, 0.0f);
    for (int bad = 0; bad <= 1; bad++) {
        embed_case(g, 8, 48, 257, 48, 12, bad);
        embed_case(g, 4, 48, 257, 16, 12, bad); /* int4: the odd vocabulary's last column in a half byte */
    }
    dmrt_gpu_destroy(g);
    printf("%s: %d failed checks\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
