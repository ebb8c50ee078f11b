/* gemm_epilogue.cu: a product and what follows it in one call (dmrt_gpu_gemm_epilogue): a
 * bias added to every row of the result (a linear layer's forward), or the sums of the
 * second operand's rows (a linear layer's bias gradient, beside its weight's). cuBLASLt
 * does either in the product's own kernel, its BIAS and BGRADA epilogues: no kernel fills
 * the result with the bias first and none reads the output's gradient again to sum it.
 *
 * Row-major C (m, n) = op(A) op(B) is column-major C^T (n, m) = op(B)^T op(A)^T (gpu.cu's
 * mapping): cuBLASLt's A is our b and its B our a. So the bias, n floats, runs along the
 * rows of cuBLASLt's D (BIAS), and the bias gradient sums its A, our op(B), over the
 * product's k (BGRADA).
 *
 * Each shape (operand types, transposes, sizes, strides, the pointers' alignments) is
 * planned once: its descriptors and the algorithm cuBLASLt's heuristic picks are kept in
 * g->lt until dmrt_gpu_destroy. Where cuBLASLt offers no algorithm for a shape, that shape
 * runs the runtime's own kernels around the plain product (a fill before it, or the sums
 * after it; one line on stderr says so the first time), as does a shape whose
 * cublasLtMatmul call refuses its arguments; DMRT_CUBLASLT=require makes either a failure,
 * =off runs every shape so. cuBLASLt's workspace is the 4 MiB sum_partials
 * buffer, which only kernels of the same stream use (in order).
 * Never run on a GPU yet (docs/gpu.md, "Not done yet"). */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_internal.h"

/* DMRT_CUBLASLT: what a shape cuBLASLt offers no algorithm for does (gpu_library_mode's) */
typedef enum { LT_AUTO = GPU_LIBRARY_AUTO, LT_REQUIRE = GPU_LIBRARY_REQUIRE, LT_OFF = GPU_LIBRARY_OFF } lt_mode;

typedef enum { LT_BIAS, LT_BIAS_GRAD } lt_epilogue;

/* What a plan depends on; compared whole (memcmp), padding included, so always zeroed
 * (memset) before its fields are set. */
typedef struct lt_shape {
    int operands, trans_a, trans_b, tf32;
    lt_epilogue epilogue;
    int64_t m, n, k, lda, ldb, ldc;
    int align_a, align_b, align_c, align_bias;  /* bytes, powers of 2 up to 256 */
} lt_shape;

typedef struct lt_entry {
    lt_shape shape;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;  /* cuBLASLt's A (our b), B (our a), C = D */
    cublasLtMatmulAlgo_t algo;
    int planless;                    /* the runtime's own kernels run this shape */
} lt_entry;

struct gpu_lt {
    lt_mode mode;
    cublasLtHandle_t handle;
    lt_entry *entries;  /* (n) one a shape */
    int n;
};

/* The largest power of 2 up to 256 that divides the address (256 for NULL). */
static int alignment_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int align = 1;
    while (align < 256 && a % (uintptr_t)(2 * align) == 0) align *= 2;
    return align;
}

static cudaDataType_t type_of(int operands) {
    return operands == DMRT_GPU_OPERANDS_BF16 ? CUDA_R_16BF : operands == DMRT_GPU_OPERANDS_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static void entry_free(lt_entry *e) {
    if (e->a) (void)cublasLtMatrixLayoutDestroy(e->a);
    if (e->b) (void)cublasLtMatrixLayoutDestroy(e->b);
    if (e->c) (void)cublasLtMatrixLayoutDestroy(e->c);
    if (e->op) (void)cublasLtMatmulDescDestroy(e->op);
    e->a = e->b = e->c = NULL;
    e->op = NULL;
}

#define LT_TRY(call)                                                                                  \
    do {                                                                                              \
        cublasStatus_t try_s_ = (call);                                                               \
        if (try_s_ != CUBLAS_STATUS_SUCCESS) {                                                        \
            snprintf(why, why_size, "%s: %s", #call, cublasGetStatusString(try_s_));                  \
            return 1;                                                                                 \
        }                                                                                             \
    } while (0)

/* The descriptors of e->shape and cuBLASLt's algorithm for them: 0, or 1 with why said. */
static int make_plan(struct gpu_lt *c, lt_entry *e, const void *bias, uint64_t workspace, char *why, size_t why_size) {
    const lt_shape *s = &e->shape;
    if (s->align_bias < 16) {
        snprintf(why, why_size, "its vector is not 16-byte aligned");
        return 1;
    }
    if (s->epilogue == LT_BIAS_GRAD && s->trans_b) {
        /* BGRADA reduces a cuBLASLt A that is not transposed (generated code never asks otherwise) */
        snprintf(why, why_size, "BGRADA takes no transposed operand");
        return 1;
    }
    const cudaDataType_t ab = type_of(s->operands);
    const cublasComputeType_t compute = s->tf32 && ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    LT_TRY(cublasLtMatmulDescCreate(&e->op, compute, CUDA_R_32F));
    const cublasOperation_t op_lt_a = s->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op_lt_b = s->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t epilogue = s->epilogue == LT_BIAS ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_BGRADA;
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof op_lt_a));
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof op_lt_b));
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    /* the vector's type is D's, f32, by default */
    LT_TRY(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    /* column-major: our b (k, n) row-major is (n, k) with ld ldb, transposed when trans_b */
    LT_TRY(cublasLtMatrixLayoutCreate(&e->a, ab, (uint64_t)(s->trans_b ? s->k : s->n), (uint64_t)(s->trans_b ? s->n : s->k),
                                      s->ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&e->b, ab, (uint64_t)(s->trans_a ? s->m : s->k), (uint64_t)(s->trans_a ? s->k : s->m),
                                      s->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&e->c, CUDA_R_32F, (uint64_t)s->n, (uint64_t)s->m, s->ldc));
    cublasLtMatmulPreference_t pref = NULL;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    const uint32_t align_a = (uint32_t)s->align_b, align_b = (uint32_t)s->align_a, align_c = (uint32_t)s->align_c;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                             sizeof workspace);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(c->handle, e->op, e->a, e->b, e->c, e->c, pref, 1, &result, &found);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found >= 1) st = result.state;
    if (st != CUBLAS_STATUS_SUCCESS || found < 1) {
        snprintf(why, why_size, "%s", st != CUBLAS_STATUS_SUCCESS ? cublasGetStatusString(st) : "cuBLASLt offers no algorithm");
        return 1;
    }
    e->algo = result.algo;
    return 0;
}

static const char *shape_words(const lt_shape *s, char *buf, size_t size) {
    static const char *types[] = {"fp32", "bf16", "fp16"};
    snprintf(buf, size, "%s (%lld, %lld) x (%lld, %lld)%s%s, %s", types[s->operands], (long long)s->m, (long long)s->k,
             (long long)s->k, (long long)s->n, s->trans_a ? ", a transposed" : "", s->trans_b ? ", b transposed" : "",
             s->epilogue == LT_BIAS ? "bias" : "bias gradient");
    return buf;
}

/* A shape cuBLASLt will not run (why): under DMRT_CUBLASLT=require the failure, else one line
 * on stderr and DMRT_OK (the shape then takes the runtime's own kernels). */
static int refused(dmrt_gpu *g, const lt_shape *s, const char *why) {
    char words[160];
    shape_words(s, words, sizeof words);
    if (g->lt->mode == LT_REQUIRE)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "cuBLASLt, %s: %s", words, why);
    fprintf(stderr,
            "dmrt: cuBLASLt, %s: %s; this shape runs the product and its own kernels instead "
            "(DMRT_CUBLASLT=require makes this an error)\n",
            words, why);
    return DMRT_OK;
}

/* *entry: the plan of shape s, made now if it is new (planless where cuBLASLt offers none,
 * said once on stderr, or DMRT_CUBLASLT=off). DMRT_OK or the failure (g->error). */
static int entry_of(dmrt_gpu *g, const lt_shape *s, const void *bias, lt_entry **entry) {
    if (!g->lt) {
        int mode = gpu_library_mode_from_env("DMRT_CUBLASLT");
        if (mode < 0)
            return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__, "DMRT_CUBLASLT=%s: expected auto, require or off",
                                 getenv("DMRT_CUBLASLT"));
        if (!(g->lt = (struct gpu_lt *)calloc(1, sizeof *g->lt)))
            return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "cuBLASLt plans: out of host memory");
        g->lt->mode = (lt_mode)mode;
    }
    struct gpu_lt *c = g->lt;
    if (!c->handle && c->mode != LT_OFF) CUBLAS_CHECK(g, cublasLtCreate(&c->handle));
    for (int i = 0; i < c->n; i++)
        if (!memcmp(&c->entries[i].shape, s, sizeof *s)) {
            *entry = &c->entries[i];
            return DMRT_OK;
        }
    lt_entry *grown = (lt_entry *)realloc(c->entries, (size_t)(c->n + 1) * sizeof *grown);
    if (!grown) return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "cuBLASLt plans: out of host memory");
    c->entries = grown;
    lt_entry *e = &c->entries[c->n];
    memset(e, 0, sizeof *e);
    e->shape = *s;
    char why[256] = "";
    int no_plan = c->mode != LT_OFF &&
                  make_plan(c, e, bias, (uint64_t)DMRT_CUDA_SUM_PARTIALS_FLOATS * sizeof(float), why, sizeof why);
    if (no_plan) {
        entry_free(e);
        int rc = refused(g, s, why);
        if (rc != DMRT_OK) return rc;
    }
    e->planless = c->mode == LT_OFF || no_plan;
    c->n++;
    *entry = e;
    return DMRT_OK;
}

void dmrt_gpu_lt_destroy(dmrt_gpu *g) {
    if (!g || !g->lt) return;
    for (int i = 0; i < g->lt->n; i++) entry_free(&g->lt->entries[i]);
    if (g->lt->handle) (void)cublasLtDestroy(g->lt->handle);
    free(g->lt->entries);
    free(g->lt);
    g->lt = NULL;
}

/* ---- the runtime's own kernels, where cuBLASLt runs no epilogue ------------------------ */

static __device__ __forceinline__ float as_float(float x) { return x; }
static __device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ float as_float(__half x) { return __half2float(x); }

/* Every row of c (m, n; rows ldc apart) = bias. */
static __global__ void fill_rows(float *c, int64_t m, int64_t n, int64_t ldc, const float *bias) {
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < m * n; p += (int64_t)gridDim.x * blockDim.x)
        c[(p / n) * ldc + p % n] = bias[p % n];
}

/* partial[chunk * n + j] = the sum of op(B)[r, j] over the rows r of the chunk, in order;
 * op(B)[r, j] is b[r * ldb + j], or b[j * ldb + r] when trans_b. */
template <typename T>
static __global__ void column_partials(const T *b, int trans_b, int64_t k, int64_t n, int64_t ldb, int64_t rows_per_chunk,
                                       int64_t chunks, float *partial) {
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < chunks * n; q += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = q % n, chunk = q / n;
        const int64_t end = (chunk + 1) * rows_per_chunk < k ? (chunk + 1) * rows_per_chunk : k;
        float acc = 0.0f;
        for (int64_t r = chunk * rows_per_chunk; r < end; r++) acc += as_float(b[trans_b ? j * ldb + r : r * ldb + j]);
        partial[q] = acc;
    }
}

/* out[j] = the chunks' sums of column j, in chunk order. */
static __global__ void column_totals(const float *partial, int64_t n, int64_t chunks, float *out) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int64_t chunk = 0; chunk < chunks; chunk++) acc += partial[chunk * n + j];
        out[j] = acc;
    }
}

/* bias_grad (n) = the sums of op(B)'s k rows, in two launches through sum_partials. */
static int column_sums(dmrt_gpu *g, int operands, int trans_b, int64_t k, int64_t n, const void *b, int64_t ldb,
                       float *bias_grad) {
    if (k == 0) {
        CUDA_CHECK(g, cudaMemsetAsync(bias_grad, 0, (size_t)n * sizeof(float), g->stream));
        return DMRT_OK;
    }
    int64_t rows_per_chunk = 32, chunks = (k + rows_per_chunk - 1) / rows_per_chunk;
    if (chunks * n > DMRT_CUDA_SUM_PARTIALS_FLOATS) {
        chunks = DMRT_CUDA_SUM_PARTIALS_FLOATS / n < 1 ? 1 : DMRT_CUDA_SUM_PARTIALS_FLOATS / n;
        rows_per_chunk = (k + chunks - 1) / chunks;
        chunks = (k + rows_per_chunk - 1) / rows_per_chunk;
    }
    if (chunks * n > DMRT_CUDA_SUM_PARTIALS_FLOATS) {
        /* n alone is more than the partials hold: one chunk, straight into bias_grad */
        rows_per_chunk = k;
        chunks = 1;
    }
    float *partial = chunks == 1 ? bias_grad : g->sum_partials;
    const unsigned blocks = gpu_blocks(chunks * n, 256);
    if (operands == DMRT_GPU_OPERANDS_BF16)
        column_partials<<<blocks, 256, 0, g->stream>>>((const __nv_bfloat16 *)b, trans_b, k, n, ldb, rows_per_chunk, chunks,
                                                       partial);
    else if (operands == DMRT_GPU_OPERANDS_F16)
        column_partials<<<blocks, 256, 0, g->stream>>>((const __half *)b, trans_b, k, n, ldb, rows_per_chunk, chunks, partial);
    else
        column_partials<<<blocks, 256, 0, g->stream>>>((const float *)b, trans_b, k, n, ldb, rows_per_chunk, chunks, partial);
    LAUNCH_CHECK(g, "column_partials");
    if (chunks == 1) return DMRT_OK;
    column_totals<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(g->sum_partials, n, chunks, bias_grad);
    LAUNCH_CHECK(g, "column_totals");
    return DMRT_OK;
}

/* ---- the entry point --------------------------------------------------------------------- */

int dmrt_gpu_gemm_epilogue(dmrt_gpu *g, int operands, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           const void *a, int64_t lda, const void *b, int64_t ldb, float beta, float *c, int64_t ldc,
                           const float *bias, float *bias_grad) {
    GPU_ENTER(g);
    ARG_CHECK(g, operands == DMRT_GPU_OPERANDS_F32 || operands == DMRT_GPU_OPERANDS_BF16 ||
                     operands == DMRT_GPU_OPERANDS_F16);
    ARG_CHECK(g, !(bias && bias_grad));
    ARG_CHECK(g, !bias || beta == 0.0f);
    const cudaDataType_t ab = type_of(operands);
    if (!bias && !bias_grad)
        return dmrt_gpu_gemm_ex(g, "dmrt_gpu_gemm_epilogue", ab, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, 1,
                                0, 0, 0);
    int rc = dmrt_gpu_gemm_sizes(g, "dmrt_gpu_gemm_epilogue", m, n, k, lda, ldb, ldc, 1);
    if (rc != DMRT_OK) return rc;
    if (n == 0) return DMRT_OK;
    ARG_CHECK(g, c != NULL && (m == 0 || k == 0 || a) && (k == 0 || b));
    lt_shape s;
    memset(&s, 0, sizeof s);
    s.operands = operands, s.trans_a = trans_a != 0, s.trans_b = trans_b != 0, s.tf32 = g->tf32;
    s.epilogue = bias ? LT_BIAS : LT_BIAS_GRAD;
    s.m = m, s.n = n, s.k = k, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
    s.align_a = alignment_of(a), s.align_b = alignment_of(b), s.align_c = alignment_of(c);
    const void *vector = bias ? (const void *)bias : (const void *)bias_grad;
    s.align_bias = alignment_of(vector);
    lt_entry *e = NULL;
    /* an empty product (m or k 0) is the runtime's: cuBLASLt takes no zero sizes */
    if (m > 0 && k > 0 && (rc = entry_of(g, &s, vector, &e)) != DMRT_OK) return rc;
    if (e && !e->planless) {
        CUBLAS_CHECK(g, cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof vector));
        const float alpha = 1.0f;
        cublasStatus_t st = cublasLtMatmul(g->lt->handle, e->op, &alpha, b, e->a, a, e->b, &beta, c, e->c, c, e->c, &e->algo,
                                           g->sum_partials, (size_t)DMRT_CUDA_SUM_PARTIALS_FLOATS * sizeof(float), g->stream);
        if (st == CUBLAS_STATUS_SUCCESS) return DMRT_OK;
        (void)cudaGetLastError();
        /* refused at the call, its arguments checked before anything ran: this shape takes
         * the runtime's path from now on, as if no algorithm had been offered. Any other
         * failure may have run part of the product: the step fails. */
        if (st != CUBLAS_STATUS_NOT_SUPPORTED && st != CUBLAS_STATUS_INVALID_VALUE)
            return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "cublasLtMatmul failed: %s", cublasGetStatusString(st));
        char why[96];
        snprintf(why, sizeof why, "cublasLtMatmul: %s", cublasGetStatusString(st));
        if ((rc = refused(g, &s, why)) != DMRT_OK) return rc;
        entry_free(e);
        e->planless = 1;
    }
    if (bias) {
        if (m > 0) {
            fill_rows<<<gpu_blocks(m * n, 256), 256, 0, g->stream>>>(c, m, n, ldc, bias);
            LAUNCH_CHECK(g, "fill_rows");
        }
        return dmrt_gpu_gemm_ex(g, "dmrt_gpu_gemm_epilogue", ab, trans_a, trans_b, m, n, k, a, lda, b, ldb, 1.0f, c, ldc, 1,
                                0, 0, 0);
    }
    rc = dmrt_gpu_gemm_ex(g, "dmrt_gpu_gemm_epilogue", ab, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, 1, 0, 0,
                          0);
    if (rc != DMRT_OK) return rc;
    return column_sums(g, operands, trans_b, k, n, b, ldb, bias_grad);
}
