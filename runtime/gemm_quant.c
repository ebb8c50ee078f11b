/* gemm_quant.c: weights stored narrow (dmc --quantize int8-weights, int4-weights) and the
 * product that reads them: the weight is widened to f32 into the calling thread's buffer,
 * row by row (in parallel over the rank's threads), and OpenBLAS's sgemm multiplies it. The
 * same plain C runs on every CPU; what shrinks is the weight as stored and as saved
 * (dmrt_qweight, dmrt.h), not the product's arithmetic. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "dmrt.h"
#include "dmrt_quant_size.h"
#include "internal.h"

/* the largest |q| of a width: symmetric, so -qmax-1 is never made but by a clamp */
static int qmax_of(int bits) { return bits == 8 ? 127 : 7; }

int64_t dmrt_qweight_groups(const dmrt_qweight *q) { return (q->rows + q->group - 1) / q->group; }

int64_t dmrt_qweight_bytes(const dmrt_qweight *q) {
    return dmrt_qweight_data_bytes(q->bits, q->rows, q->cols);
}

int dmrt_qweight_init(dmrt_qweight *q, int bits, int64_t rows, int64_t cols, int64_t group) {
    *q = (dmrt_qweight){.bits = bits, .rows = rows, .cols = cols, .group = dmrt_qweight_group_of(bits, rows, group)};
    if ((bits != 8 && bits != 4) || rows <= 0 || cols <= 0 || q->group <= 0) return -1;
    q->data = dmrt_alloc((size_t)dmrt_qweight_bytes(q));
    q->scale = dmrt_alloc((size_t)dmrt_qweight_scale_count(rows, cols, q->group) * sizeof(float));
    if (!q->data || !q->scale) {
        dmrt_qweight_free(q);
        return -1;
    }
    return 0;
}

void dmrt_qweight_free(dmrt_qweight *q) {
    dmrt_free(q->data);
    dmrt_free(q->scale);
    q->data = NULL;
    q->scale = NULL;
}

/* q's integer at [r, c] */
static int q_at(const dmrt_qweight *q, int64_t r, int64_t c) {
    if (q->bits == 8) return ((const int8_t *)q->data)[r * q->cols + c];
    uint8_t byte = q->data[r * ((q->cols + 1) / 2) + c / 2];
    int nibble = (c & 1) ? byte >> 4 : byte & 15;
    return nibble >= 8 ? nibble - 16 : nibble;
}

static void q_set(dmrt_qweight *q, int64_t r, int64_t c, int v) {
    if (q->bits == 8) {
        ((int8_t *)q->data)[r * q->cols + c] = (int8_t)v;
        return;
    }
    uint8_t *byte = &q->data[r * ((q->cols + 1) / 2) + c / 2];
    unsigned nibble = (unsigned)v & 15u;
    *byte = (uint8_t)((c & 1) ? (*byte & 0x0f) | (nibble << 4) : (*byte & 0xf0) | nibble);
}

/* w / scale rounded half to even and clamped to [-qmax - 1, qmax]. As torch's quantize_val,
 * w times the f32 reciprocal (bit for bit torch.quantize_per_channel for normal scales); but a
 * scale below about 2.9e-39 (a column of subnormal weights) has no finite reciprocal, where the
 * product would send every w to a bound and 0 to 0 * inf = NaN: there the division itself. A
 * NaN quotient (a NaN or infinite w) becomes 0, as dmrt_quantize_activations makes it: (int)NaN
 * is undefined. */
static int quantize_value(float w, float scale, float inverse, int qmax) {
    float v = nearbyintf(isinf(inverse) ? w / scale : w * inverse);
    if (isnan(v)) return 0;
    return v > (float)qmax ? qmax : v < (float)(-qmax - 1) ? -qmax - 1 : (int)v;
}

void dmrt_quantize_weight(dmrt_qweight *q, const float *w) {
    const int qmax = qmax_of(q->bits);
    /* element (r, c) of the product's [k, n] in w's layout */
    const int64_t row_step = q->transposed ? 1 : q->cols, col_step = q->transposed ? q->rows : 1;
    for (int64_t g = 0; g < dmrt_qweight_groups(q); g++) {
        int64_t r0 = g * q->group, r1 = r0 + q->group < q->rows ? r0 + q->group : q->rows;
        for (int64_t c = 0; c < q->cols; c++) {
            float amax = 0.0f;
            for (int64_t r = r0; r < r1; r++) amax = fmaxf(amax, fabsf(w[r * row_step + c * col_step]));
            float scale = amax > 0.0f ? amax / (float)qmax : 1.0f;
            float inverse = 1.0f / scale;
            q->scale[g * q->cols + c] = scale;
            for (int64_t r = r0; r < r1; r++)
                q_set(q, r, c, quantize_value(w[r * row_step + c * col_step], scale, inverse, qmax));
        }
    }
}

void dmrt_dequantize_param(const dmrt_qweight *q, float *w) {
    if (!q->transposed) {
        dmrt_dequantize_rows(q, 0, q->rows, w);
        return;
    }
    float *row = dmrt_thread_floats((size_t)q->cols, "dmrt_dequantize_param");
    for (int64_t r = 0; r < q->rows; r++) {
        dmrt_dequantize_rows(q, r, r + 1, row);
        for (int64_t c = 0; c < q->cols; c++) w[c * q->rows + r] = row[c];
    }
}

void dmrt_dequantize_rows(const dmrt_qweight *q, int64_t r0, int64_t r1, float *w) {
    for (int64_t r = r0; r < r1; r++) {
        const float *scale = q->scale + (r / q->group) * q->cols;
        float *row = w + (r - r0) * q->cols;
        if (q->bits == 8) {
            const int8_t *src = (const int8_t *)q->data + r * q->cols;
            for (int64_t c = 0; c < q->cols; c++) row[c] = (float)src[c] * scale[c];
        } else {
            for (int64_t c = 0; c < q->cols; c++) row[c] = (float)q_at(q, r, c) * scale[c];
        }
    }
}

void dmrt_qweight_gather_rows(const dmrt_qweight *q, const int32_t *ids, int64_t n, float *out) {
    /* row id of the parameter is column id of q (its transpose): q->rows values, one per row of q */
    for (int64_t r = 0; r < n; r++) {
        int64_t id = ids[r];
        float *dst = out + r * q->rows;
        for (int64_t c = 0; c < q->rows; c++) {
            float scale = q->scale[(c / q->group) * q->cols + id];
            int q_value = q->bits == 8 ? ((const int8_t *)q->data)[c * q->cols + id] : q_at(q, c, id);
            dst[c] = (float)q_value * scale;
        }
    }
}

/* ---- the product ------------------------------------------------------------------------ */

/* the calling thread's buffer of at least count floats (thread_floats.c) */
static float *thread_buffer(size_t count) { return dmrt_thread_floats(count, "dmrt_gemm_wq"); }

/* Columns [col0, col0 + cols) of row r of q, dequantized into w: dmrt_dequantize_rows's
 * values of those columns. */
static void dequantize_row_window(const dmrt_qweight *q, int64_t r, int64_t col0, int64_t cols, float *w) {
    const float *scale = q->scale + (r / q->group) * q->cols + col0;
    if (q->bits == 8) {
        const int8_t *src = (const int8_t *)q->data + r * q->cols + col0;
        for (int64_t c = 0; c < cols; c++) w[c] = (float)src[c] * scale[c];
    } else {
        for (int64_t c = 0; c < cols; c++) w[c] = (float)q_at(q, r, col0 + c) * scale[c];
    }
}

void dmrt_gemm_wq_window_split(int threads, const dmrt_qweight *q, int64_t col0, int64_t cols, int64_t m,
                               const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    if (col0 < 0 || cols <= 0 || col0 + cols > q->cols || (q->transposed && cols != q->cols)) {
        fprintf(stderr, "dmrt_gemm_wq: columns %lld to %lld of a weight of %lld%s\n", (long long)col0,
                (long long)(col0 + cols), (long long)q->cols, q->transposed ? ", read transposed (no window)" : "");
        abort();
    }
    /* a block of columns at a time (all of them but for a large weight: dmrt_quant_size.h) */
    const int64_t step = dmrt_qweight_widen_cols(q->rows, cols);
    float *w = thread_buffer((size_t)(q->rows * step));
    int workers = threads > 1 ? threads : 1;
    (void)workers; /* unused without OpenMP */
    for (int64_t b0 = 0; b0 < cols; b0 += step) {
        const int64_t nb = cols - b0 < step ? cols - b0 : step;
        DMRT_PARALLEL_FOR(workers)
        for (int64_t r = 0; r < q->rows; r++) dequantize_row_window(q, r, col0 + b0, nb, w + r * nb);
        if (threads > 1)
            dmrt_sgemm_split(threads, 0, 0, m, nb, q->rows, 1.0f, a, lda, w, nb, beta, c + b0, ldc);
        else
            dmrt_sgemm(0, 0, m, nb, q->rows, 1.0f, a, lda, w, nb, beta, c + b0, ldc);
    }
}

void dmrt_gemm_wq_split(int threads, const dmrt_qweight *q, int64_t m, const float *a, int64_t lda, float beta,
                        float *c, int64_t ldc) {
    dmrt_gemm_wq_window_split(threads, q, 0, q->cols, m, a, lda, beta, c, ldc);
}
