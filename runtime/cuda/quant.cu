/* quant.cu: the products of a --quantize program on the GPU (dmrt_cuda.h, "quantized
 * products"), with the C target's numerics: the weight-only modes widen the narrow weight
 * to f32 as runtime/gemm_quant.c does and multiply with cuBLAS's sgemm; int8 follows
 * runtime/gemm_int8.c step by step (quantize the left operand, exact int32 sums, scale
 * back), every float operation an explicitly rounded one (__fmul_rn, __fadd_rn,
 * __fdiv_rn) so that nvcc fuses nothing the C target does not: the same bits from the
 * same inputs. */
#include "gpu_internal.h"

#define QX_MAX 127

/* ---- the weight-only modes --------------------------------------------------------------- */

/* w[r, c - col0] = q[r, c] * scale[r / group, c] for the columns [col0, col0 + cols) of
 * q's [rows, q->cols]: dmrt_dequantize_rows's one rounding, into a [rows, cols] block (the
 * layout runtime/gemm_quant.c widens into; a weight read transposed is stored as the
 * product's [k, n] already). */
/* q[r, c] of a narrow [rows, cols] weight: int8 a byte each; int4 two per byte along a
 * row, column 2j in the low nibble, two's complement. */
__device__ static inline int narrow_at(const uint8_t *data, int bits, int64_t cols, int64_t r, int64_t c) {
    if (bits == 8) return ((const int8_t *)data)[r * cols + c];
    const int byte = data[r * ((cols + 1) / 2) + c / 2], nibble = (c & 1) ? byte >> 4 : byte & 15;
    return nibble >= 8 ? nibble - 16 : nibble;
}

__global__ static void widen_kernel(const uint8_t *data, const float *scale, float *w, int bits, int64_t rows,
                                    int64_t q_cols, int64_t group, int64_t col0, int64_t cols) {
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = col0 + i % cols;
        w[i] = __fmul_rn((float)narrow_at(data, bits, q_cols, r, c), scale[(r / group) * q_cols + c]);
    }
}

/* A window of columns [col0, col0 + cols) of q (cols q->cols: the whole): the arguments'
 * check. */
static int window_ok(const dmrt_qweight *q, int64_t col0, int64_t cols) {
    return col0 >= 0 && cols > 0 && col0 + cols <= q->cols && (!q->transposed || cols == q->cols);
}

int dmrt_gpu_gemm_wq_window(dmrt_gpu *g, const dmrt_qweight *q, const uint8_t *data, const float *scale, void *work,
                            int64_t col0, int64_t cols, int64_t m, const float *a, int64_t lda, float beta, float *c,
                            int64_t ldc) {
    GPU_ENTER(g);
    ARG_CHECK(g, q && data && scale && work && (q->bits == 8 || q->bits == 4) && q->group > 0 && m >= 0 &&
                     window_ok(q, col0, cols));
    if (m == 0) return DMRT_OK;
    /* the window's columns widened a block at a time into work (all of them but for a
     * weight over 16 MiB in f32: dmrt_quant_size.h, as the C target does), each block
     * multiplied into its columns of c */
    float *w = (float *)work;
    const int64_t step = dmrt_qweight_widen_cols(q->rows, cols);
    for (int64_t b0 = 0; b0 < cols; b0 += step) {
        const int64_t nb = cols - b0 < step ? cols - b0 : step;
        widen_kernel<<<gpu_blocks(q->rows * nb, 256), 256, 0, g->stream>>>(data, scale, w, q->bits, q->rows, q->cols,
                                                                         q->group, col0 + b0, nb);
        LAUNCH_CHECK(g, "widen_kernel");
        int status = dmrt_gpu_sgemm(g, 0, 0, m, nb, q->rows, a, lda, w, nb, beta, c + b0, ldc, 1, 0, 0, 0);
        if (status != DMRT_OK) return status;
    }
    return DMRT_OK;
}

int dmrt_gpu_gemm_wq(dmrt_gpu *g, const dmrt_qweight *q, const uint8_t *data, const float *scale, void *work, int64_t m,
                     const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    return dmrt_gpu_gemm_wq_window(g, q, data, scale, work, 0, q ? q->cols : 0, m, a, lda, beta, c, ldc);
}

/* ---- int8 -------------------------------------------------------------------------------- */

/* q_x = clamp(round-half-even(x / s), -127, 127), a NaN 0: dmrt_quantize_activations's
 * values (its add-and-subtract of 1.5 * 2^23 is rintf where |x / s| <= 2^22, and both
 * clamp the larger ones alike). */
__global__ static void quantize_kernel(const float *a, int64_t lda, int64_t m, int64_t k, float s, int8_t *qa) {
    const int64_t n = m * k;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = __fdiv_rn(a[(i / k) * lda + i % k], s);
        v = isnan(v) ? 0.0f : fminf(fmaxf(rintf(v), (float)-QX_MAX), (float)QX_MAX);
        qa[i] = (int8_t)(int)v;
    }
}

/* acc[i, j] = sum over p of qa[i, p] qw[p, j] in int32 (qw's rows ldw apart): where cuBLAS
 * does not take the shape. Exact, so its order does not matter. */
__global__ static void s8s8s32_kernel(const int8_t *qa, const int8_t *qw, int64_t ldw, int32_t *acc, int64_t m,
                                      int64_t n, int64_t k) {
    const int64_t count = m * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int8_t *row = qa + (i / n) * k, *col = qw + i % n;
        int32_t sum = 0;
        for (int64_t p = 0; p < k; p++) sum += (int32_t)row[p] * (int32_t)col[p * ldw];
        acc[i] = sum;
    }
}

/* c[i, j] (+)= (float)acc[i, j] * (s * scale[j]): the scales' product first, then its
 * product with the sum, each rounded; then the add where beta is 1. */
__global__ static void scale_back_kernel(const int32_t *acc, const float *scale, float s, float *c, int64_t ldc,
                                         int64_t m, int64_t n, int accumulate) {
    const int64_t count = m * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / n, col = i % n;
        const float y = __fmul_rn(__int2float_rn(acc[i]), __fmul_rn(s, scale[col]));
        float *out = c + row * ldc + col;
        *out = accumulate ? __fadd_rn(*out, y) : y;
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* The int32 sums acc (m, n) = qa (m, k) qw (k, n), row-major, qw's rows ldw apart (a
 * window's columns), the others contiguous. cuBLAS's int8 GemmEx (CUBLAS_COMPUTE_32I)
 * asks for dimensions and leading dimensions that are multiples of 4 and aligned pointers;
 * elsewhere, or where it refuses the call, the plain kernel runs. Row-major acc is
 * column-major acc^T = qw^T qa^T: the operands swapped. */
static int s8s8s32(dmrt_gpu *g, const int8_t *qa, const int8_t *qw, int64_t ldw, int32_t *acc, int64_t m, int64_t n,
                   int64_t k) {
    const int fits = m % 4 == 0 && n % 4 == 0 && k % 4 == 0 && ldw % 4 == 0 && m <= INT_MAX && ldw <= INT_MAX &&
                     k <= INT_MAX && aligned16(qa) && aligned16(qw) && aligned16(acc);
    if (fits) {
        const int32_t one = 1, zero = 0;
        cublasStatus_t st = cublasGemmEx(g->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, qw, CUDA_R_8I,
                                         (int)ldw, qa, CUDA_R_8I, (int)k, &zero, acc, CUDA_R_32I, (int)n,
                                         CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT);
        if (st == CUBLAS_STATUS_SUCCESS) return DMRT_OK;
        (void)cudaGetLastError();
    }
    s8s8s32_kernel<<<gpu_blocks(m * n, 256), 256, 0, g->stream>>>(qa, qw, ldw, acc, m, n, k);
    LAUNCH_CHECK(g, "s8s8s32_kernel");
    return DMRT_OK;
}

/* Calibration: A's |x| recorded on the host (its rows through pinned memory), then the f32
 * forward's product. */
static int calibration_product(dmrt_gpu *g, const dmrt_qweight *q, const float *w_f32, int64_t col0, int64_t cols,
                               int64_t m, const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    ARG_CHECK(g, w_f32 != NULL);
    const size_t bytes = (size_t)((m - 1) * lda + q->rows) * sizeof(float);
    float *host = NULL;
    int rc = dmrt_gpu_wait_stream(g, g->stream); /* the staging buffer may be reallocated */
    if (rc == DMRT_OK) rc = dmrt_gpu_staging(g, bytes, &host);
    if (rc == DMRT_OK) rc = dmrt_gpu_copy(g, host, a, bytes, DMRT_DEVICE_TO_HOST);
    if (rc != DMRT_OK) return rc;
    dmrt_act_stats_record(q->calib, m, host, lda, q->rows);
    /* w_f32 is the parameter: [k, n] (a window: at its first column), or [n, k] read transposed */
    (void)col0;
    return dmrt_gpu_sgemm(g, 0, q->transposed, m, cols, q->rows, a, lda, w_f32, q->transposed ? q->rows : q->cols, beta, c,
                          ldc, 1, 0, 0, 0);
}

int dmrt_gpu_gemm_i8_window(dmrt_gpu *g, const dmrt_qweight *q, const uint8_t *data, const float *scale,
                            const float *w_f32, void *work, int64_t col0, int64_t cols, int64_t m, const float *a,
                            int64_t lda, float beta, float *c, int64_t ldc) {
    GPU_ENTER(g);
    ARG_CHECK(g, q && data && scale && work && m >= 0 && (beta == 0.0f || beta == 1.0f) && window_ok(q, col0, cols));
    if (m == 0) return DMRT_OK;
    if (q->calib) return calibration_product(g, q, w_f32, col0, cols, m, a, lda, beta, c, ldc);
    if (q->bits != 8 || !(q->input_scale > 0.0f))
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__, "dmrt_gpu_gemm_i8: %s",
                             q->bits != 8 ? "the weight is not int8" : "the product's input scale was never calibrated");
    const int64_t k = q->rows, n = cols;
    int8_t *qa = (int8_t *)work;
    int32_t *acc = (int32_t *)((char *)work + (m * k + 255) / 256 * 256);
    quantize_kernel<<<gpu_blocks(m * k, 256), 256, 0, g->stream>>>(a, lda, m, k, q->input_scale, qa);
    LAUNCH_CHECK(g, "quantize_kernel");
    int rc = s8s8s32(g, qa, (const int8_t *)data + col0, q->cols, acc, m, n, k);
    if (rc != DMRT_OK) return rc;
    scale_back_kernel<<<gpu_blocks(m * n, 256), 256, 0, g->stream>>>(acc, scale + col0, q->input_scale, c, ldc, m, n,
                                                                     beta != 0.0f);
    LAUNCH_CHECK(g, "scale_back_kernel");
    return DMRT_OK;
}

int dmrt_gpu_gemm_i8(dmrt_gpu *g, const dmrt_qweight *q, const uint8_t *data, const float *scale, const float *w_f32,
                     void *work, int64_t m, const float *a, int64_t lda, float beta, float *c, int64_t ldc) {
    return dmrt_gpu_gemm_i8_window(g, q, data, scale, w_f32, work, 0, q ? q->cols : 0, m, a, lda, beta, c, ldc);
}

/* ---- a table held narrow only (--quantize-embeddings) -------------------------------------- */

/* out[r, c] = q[c, ids[r]] * scale[c / group, ids[r]]: row id of the parameter is column id
 * of q (its transpose), dmrt_qweight_gather_rows's values; an id outside [0, q->cols)
 * records the fault and gives a zero row (dmrt_gpu_embed's rule). */
__global__ static void embed_narrow_kernel(const uint8_t *data, const float *scale, int bits, int64_t width,
                                           int64_t vocab, int64_t group, const int32_t *ids, float *out, int64_t rows,
                                           dmrt_fault *fault, int site, int64_t position_base) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t id = ids[r];
        const int bad = id < 0 || id >= vocab;
        if (bad && threadIdx.x == 0) gpu_record_fault(fault, site, id, position_base + r);
        float *dst = out + r * width;
        for (int64_t c = threadIdx.x; c < width; c += blockDim.x)
            dst[c] = bad ? 0.0f : __fmul_rn((float)narrow_at(data, bits, vocab, c, id), scale[(c / group) * vocab + id]);
    }
}

int dmrt_gpu_embed_narrow(dmrt_gpu *g, const dmrt_qweight *q, const uint8_t *data, const float *scale,
                          const int32_t *ids, float *out, int64_t rows, int site, int64_t position_base) {
    GPU_ENTER(g);
    ARG_CHECK(g, q && data && scale && ids && out && (q->bits == 8 || q->bits == 4) && q->group > 0 && rows >= 0);
    if (rows == 0 || q->rows == 0) return DMRT_OK;
    embed_narrow_kernel<<<gpu_row_blocks(rows), gpu_row_threads(q->rows), 0, g->stream>>>(
        data, scale, q->bits, q->rows, q->cols, q->group, ids, out, rows, g->fault, site, position_base);
    LAUNCH_CHECK(g, "embed_narrow_kernel");
    return DMRT_OK;
}
