/* gpu.cu: a rank's GPU context (device, streams, cuBLAS, fault flag, staging), error
 * messages, device memory and copies, data faults, a step's upload and end, and matrix
 * products through cuBLAS.
 * The kernels are in rowwise.cu, xent.cu, embed.cu and optim.cu; the collectives and the
 * NCCL bootstrap in collectives.cu. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_internal.h"

/* ---- errors ------------------------------------------------------------------------------ */

/* Messages name the source file, not the build's relative path to it. */
static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int dmrt_gpu_fail(dmrt_gpu *g, int status, const char *file, int line, const char *fmt, ...) {
    if (!g) return status;
    int n = snprintf(g->error, sizeof g->error, "%s:%d: ", base_name(file), line);
    if (n < 0 || (size_t)n >= sizeof g->error) return status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error + n, sizeof g->error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

const char *dmrt_gpu_error(const dmrt_gpu *g) { return g ? g->error : "no gpu"; }

void *dmrt_gpu_stream(const dmrt_gpu *g) { return g ? (void *)g->stream : NULL; }

const char *dmrt_gpu_device_name(const dmrt_gpu *g) { return g ? g->name : ""; }

size_t dmrt_gpu_peak_bytes(const dmrt_gpu *g) { return g ? g->peak_bytes : 0; }

float *dmrt_gpu_sum_partials(const dmrt_gpu *g) { return g ? g->sum_partials : NULL; }

int dmrt_gpu_check_launch(dmrt_gpu *g, const char *what, const char *file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return DMRT_OK;
    return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, file ? file : "?", line, "%s failed: %s",
                         what ? what : "a kernel launch", cudaGetErrorString(e));
}

/* ---- waiting ------------------------------------------------------------------------------- */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A peer that died leaves NCCL kernels spinning forever; the NCCL comms are aborted so
 * that the stream drains and every later NCCL call fails at once. */
static void abort_nccl(dmrt_gpu *g) {
    for (int i = 0; i < g->n_nccl; i++) {
        if (g->nccl[i].nccl) (void)ncclCommAbort(g->nccl[i].nccl);
        g->nccl[i].nccl = NULL;
        g->nccl[i].pending = 0;
    }
    g->nccl_aborted = 1;
}

int dmrt_gpu_wait_stream(dmrt_gpu *g, cudaStream_t s) {
    if (g->n_nccl == 0 || g->nccl_aborted) {
        CUDA_CHECK(g, cudaStreamSynchronize(s));
        return DMRT_OK;
    }
    const double timeout = dmrt_rank_timeout(g->rank);
    const double start = now_seconds();
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) return DMRT_OK;
        if (e != cudaErrorNotReady) {
            (void)cudaGetLastError();
            return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                                 "cudaStreamQuery failed: %s", cudaGetErrorString(e));
        }
        for (int i = 0; i < g->n_nccl; i++) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(g->nccl[i].nccl, &async);
            if (r == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
            const char *axis = dmrt_comm_axis_name(g->nccl[i].comm);
            const char *why = ncclGetErrorString(r != ncclSuccess ? r : async);
            abort_nccl(g);
            return dmrt_gpu_fail(g, DMRT_ERR_COMM, __FILE__, __LINE__,
                                 "rank %d: NCCL on axis %s failed: %s", dmrt_rank_id(g->rank),
                                 axis, why);
        }
        /* Spin briefly (a step's tail is usually microseconds), then sleep: ranks may
         * outnumber the cores. */
        if (spins > 1000) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            if (now_seconds() - start > timeout) {
                abort_nccl(g);
                return dmrt_gpu_fail(g, DMRT_ERR_COMM, __FILE__, __LINE__,
                                     "rank %d: the GPU stream did not finish within %.0f s "
                                     "(a NCCL peer may have failed); NCCL aborted",
                                     dmrt_rank_id(g->rank), timeout);
            }
        }
    }
}

int dmrt_gpu_sync(dmrt_gpu *g) {
    GPU_ENTER(g);
    return dmrt_gpu_wait_stream(g, g->stream);
}

/* ---- allocation bookkeeping ------------------------------------------------------------- */

static int track(dmrt_gpu *g, void *p, size_t bytes) {
    if (g->n_allocs == g->cap_allocs) {
        int cap = g->cap_allocs ? 2 * g->cap_allocs : 64;
        gpu_alloc *a = (gpu_alloc *)realloc(g->allocs, (size_t)cap * sizeof *a);
        if (!a) return DMRT_ERR_NOMEM;
        g->allocs = a;
        g->cap_allocs = cap;
    }
    g->allocs[g->n_allocs].p = p;
    g->allocs[g->n_allocs].bytes = bytes;
    g->n_allocs++;
    g->bytes_in_use += bytes;
    if (g->bytes_in_use > g->peak_bytes) g->peak_bytes = g->bytes_in_use;
    return DMRT_OK;
}

/* Forgets p; 0 when g did not allocate it. Recent allocations are freed first, so the
 * search starts at the end. */
static int untrack(dmrt_gpu *g, void *p) {
    for (int i = g->n_allocs - 1; i >= 0; i--) {
        if (g->allocs[i].p != p) continue;
        g->bytes_in_use -= g->allocs[i].bytes;
        g->allocs[i] = g->allocs[--g->n_allocs];
        return 1;
    }
    return 0;
}

/* cudaMalloc, counted; out of memory is DMRT_ERR_NOMEM (the caller may plan smaller). */
static int device_malloc(dmrt_gpu *g, void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        size_t free_bytes = 0, total = 0;
        (void)cudaMemGetInfo(&free_bytes, &total);
        (void)cudaGetLastError();
        return dmrt_gpu_fail(g, e == cudaErrorMemoryAllocation ? DMRT_ERR_NOMEM : DMRT_ERR_DEVICE,
                             __FILE__, __LINE__,
                             "cudaMalloc(%zu bytes) failed: %s (%zu of %zu bytes free on %s)",
                             bytes, cudaGetErrorString(e), free_bytes, total, g->name);
    }
    if (track(g, *p, bytes) != DMRT_OK) {
        cudaFree(*p);
        *p = NULL;
        return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__,
                             "out of host memory for the allocation table");
    }
    return DMRT_OK;
}

static void device_free(dmrt_gpu *g, void *p) {
    if (!p) return;
    if (!untrack(g, p)) {
        dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                      "dmrt_gpu_free(%p): not a live allocation of this gpu", p);
        return;
    }
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "cudaFree(%p) failed: %s", p,
                      cudaGetErrorString(e));
    }
}

int dmrt_gpu_staging(dmrt_gpu *g, size_t bytes, float **p) {
    if (bytes > g->staging_bytes) {
        if (g->staging) CUDA_CHECK(g, cudaFreeHost(g->staging));
        g->staging = NULL;
        g->staging_bytes = 0;
        size_t want = bytes < 4096 ? 4096 : bytes;
        void *h = NULL;
        CUDA_CHECK(g, cudaHostAlloc(&h, want, cudaHostAllocPortable));
        g->staging = (float *)h;
        g->staging_bytes = want;
    }
    *p = g->staging;
    return DMRT_OK;
}

/* ---- memory ------------------------------------------------------------------------------- */

int dmrt_gpu_alloc(dmrt_gpu *g, void **p, size_t bytes) {
    if (!p) return DMRT_ERR_ARG;
    *p = NULL;
    GPU_ENTER(g);
    if (bytes == 0) return DMRT_OK;
    int rc = device_malloc(g, p, bytes);
    if (rc != DMRT_OK) return rc;
    cudaError_t e = cudaMemsetAsync(*p, 0, bytes, g->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        device_free(g, *p);
        *p = NULL;
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "cudaMemsetAsync(%zu bytes) failed: %s", bytes,
                             cudaGetErrorString(e));
    }
    return DMRT_OK;
}

void dmrt_gpu_free(dmrt_gpu *g, void *p) {
    if (!g || !p) return;
    if (cudaSetDevice(g->device) != cudaSuccess) (void)cudaGetLastError();
    device_free(g, p);
}

int dmrt_gpu_copy(dmrt_gpu *g, void *dst, const void *src, size_t bytes, dmrt_copy_kind kind) {
    GPU_ENTER(g);
    if (bytes == 0) return DMRT_OK;
    ARG_CHECK(g, dst && src);
    switch (kind) {
    case DMRT_HOST_TO_DEVICE: {
        CUDA_CHECK(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream));
        /* From pageable memory CUDA has copied src before returning; from pinned memory
         * the DMA may still read it, so wait: the caller may reuse src at once. */
        cudaPointerAttributes attr;
        CUDA_CHECK(g, cudaPointerGetAttributes(&attr, src));
        if (attr.type == cudaMemoryTypeHost) return dmrt_gpu_wait_stream(g, g->stream);
        return DMRT_OK;
    }
    case DMRT_DEVICE_TO_HOST:
        CUDA_CHECK(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream));
        return dmrt_gpu_wait_stream(g, g->stream);
    case DMRT_DEVICE_TO_DEVICE:
        CUDA_CHECK(g, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->stream));
        return DMRT_OK;
    }
    return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__, "dmrt_gpu_copy: bad kind %d",
                         (int)kind);
}

int dmrt_gpu_zero(dmrt_gpu *g, void *p, size_t bytes) {
    GPU_ENTER(g);
    if (bytes == 0) return DMRT_OK;
    ARG_CHECK(g, p != NULL);
    CUDA_CHECK(g, cudaMemsetAsync(p, 0, bytes, g->stream));
    return DMRT_OK;
}

void dmrt_gpu_fault_unpack(dmrt_fault *fault) {
    if (!fault || fault->site == 0) return;
    const uint64_t key = ~(uint64_t)fault->position;
    fault->position = (int64_t)(key >> 32);
    fault->value = (int32_t)(uint32_t)(key & 0xffffffffu);
}

int dmrt_gpu_fault_take(dmrt_gpu *g, dmrt_fault *fault) {
    GPU_ENTER(g);
    ARG_CHECK(g, fault != NULL);
    memset(fault, 0, sizeof *fault);
    dmrt_fault host;
    CUDA_CHECK(g, cudaMemcpyAsync(&host, g->fault, sizeof host, cudaMemcpyDeviceToHost, g->stream));
    int rc = dmrt_gpu_wait_stream(g, g->stream);
    if (rc != DMRT_OK) return rc;
    dmrt_gpu_fault_unpack(&host);
    *fault = host;
    if (host.site != 0) CUDA_CHECK(g, cudaMemsetAsync(g->fault, 0, sizeof *g->fault, g->stream));
    return DMRT_OK;
}

/* ---- a step without host round trips -------------------------------------------------------- */

int dmrt_gpu_upload_reserve(dmrt_gpu *g, size_t bytes) {
    GPU_ENTER(g);
    if (bytes <= g->upload_bytes) return DMRT_OK;
    ARG_CHECK(g, g->upload == NULL); /* once, at create: a step's copies may read it */
    void *p = NULL;
    CUDA_CHECK(g, cudaMallocHost(&p, bytes));
    g->upload = (char *)p;
    g->upload_bytes = bytes;
    return DMRT_OK;
}

int dmrt_gpu_upload(dmrt_gpu *g, void *dst, const void *src, size_t bytes, size_t offset) {
    GPU_ENTER(g);
    /* Offset 0 starts a step's uploads: the previous step's copies out of this memory
     * must be done (they are, once that step has ended; not after a launch failure). The
     * step's later uploads write other bytes and do not wait. A step that failed before
     * its end (an argument or launch error) left any fault it recorded set: cleared on
     * the stream, so that it neither skips this step's update nor names the old batch
     * (also when the step's first input is empty: no bytes to copy). */
    if (offset == 0) {
        CUDA_CHECK(g, cudaEventSynchronize(g->upload_event));
        CUDA_CHECK(g, cudaMemsetAsync(g->fault, 0, sizeof *g->fault, g->stream));
        /* a collective a failed step started and never waited for is done before this
         * step's kernels reuse its buffers (none pending after a whole step: no cost) */
        int rc = dmrt_gpu_nccl_join(g);
        if (rc != DMRT_OK) return rc;
    }
    if (bytes == 0) return DMRT_OK;
    ARG_CHECK(g, dst && src);
    if (!g->upload || offset > g->upload_bytes || bytes > g->upload_bytes - offset)
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "dmrt_gpu_upload: %zu bytes at %zu do not fit the %zu reserved", bytes,
                             offset, g->upload_bytes);
    memcpy(g->upload + offset, src, bytes);
    CUDA_CHECK(g, cudaMemcpyAsync(dst, g->upload + offset, bytes, cudaMemcpyHostToDevice, g->stream));
    CUDA_CHECK(g, cudaEventRecord(g->upload_event, g->stream));
    return DMRT_OK;
}

int dmrt_gpu_step_end(dmrt_gpu *g, const float *loss, float *loss_host, dmrt_fault *fault) {
    GPU_ENTER(g);
    ARG_CHECK(g, fault != NULL && loss_host != NULL);
    memset(fault, 0, sizeof *fault);
    *loss_host = 0.0f;
    if (loss)
        CUDA_CHECK(g, cudaMemcpyAsync(&g->record->loss, loss, sizeof(float), cudaMemcpyDeviceToDevice,
                                      g->stream));
    CUDA_CHECK(g, cudaMemcpyAsync(g->host_record, g->record, sizeof *g->record,
                                  cudaMemcpyDeviceToHost, g->stream));
    int rc = dmrt_gpu_wait_stream(g, g->stream);
    if (rc != DMRT_OK) return rc;
    gpu_step_record host = *g->host_record;
    dmrt_gpu_fault_unpack(&host.fault);
    *fault = host.fault;
    if (loss) *loss_host = host.loss;
    if (host.fault.site != 0) CUDA_CHECK(g, cudaMemsetAsync(g->fault, 0, sizeof *g->fault, g->stream));
    return DMRT_OK;
}

/* ---- matrix products ------------------------------------------------------------------------ */

static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

int dmrt_gpu_gemm_sizes(dmrt_gpu *g, const char *name, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                        int64_t ldc, int64_t batch) {
    if (fits_int(m) && fits_int(n) && fits_int(k) && fits_int(lda) && fits_int(ldb) && fits_int(ldc) && fits_int(batch))
        return DMRT_OK;
    return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                         "%s: m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld "
                         "batch=%lld: negative or beyond cuBLAS's 32-bit sizes",
                         name, (long long)m, (long long)n, (long long)k, (long long)lda, (long long)ldb, (long long)ldc,
                         (long long)batch);
}

/* k == 0: cuBLAS would leave C as is; beta 0 must still clear it. */
static int zero_product(dmrt_gpu *g, float beta, float *c, int64_t m, int64_t n, int64_t ldc,
                        int64_t batch, int64_t stride_c) {
    if (beta != 0.0f) return DMRT_OK;
    for (int64_t i = 0; i < batch; i++)
        CUDA_CHECK(g, cudaMemset2DAsync(c + i * stride_c, (size_t)ldc * sizeof(float), 0,
                                        (size_t)n * sizeof(float), (size_t)m, g->stream));
    return DMRT_OK;
}

/* Row-major C (m, n) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same
 * buffers with the operands swapped, each transpose flag kept (a row-major matrix read
 * column-major is its transpose). */
/* The products of dmrt_gpu_sgemm and dmrt_gpu_gemm_half: a and b of type ab (fp32, bf16 or
 * fp16), c fp32, accumulated in fp32 (TF32 only for fp32 operands, where asked). */
int dmrt_gpu_gemm_ex(dmrt_gpu *g, const char *name, cudaDataType_t ab, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, float *c, int64_t ldc,
                     int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    GPU_ENTER(g);
    if (batch < 1) batch = 1;
    if (m == 0 || n == 0) return DMRT_OK;
    int rc = dmrt_gpu_gemm_sizes(g, name, m, n, k, lda, ldb, ldc, batch);
    if (rc != DMRT_OK) return rc;
    ARG_CHECK(g, c != NULL);
    if (k == 0) return zero_product(g, beta, c, m, n, ldc, batch, stride_c);
    ARG_CHECK(g, a && b);
    const float alpha = 1.0f;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasComputeType_t compute =
        g->tf32 && ab == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (batch == 1) {
        CUBLAS_CHECK(g, cublasGemmEx(g->cublas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b,
                                     ab, (int)ldb, a, ab, (int)lda, &beta, c,
                                     CUDA_R_32F, (int)ldc, compute, CUBLAS_GEMM_DEFAULT));
        return DMRT_OK;
    }
    CUBLAS_CHECK(g, cublasGemmStridedBatchedEx(
                        g->cublas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, ab,
                        (int)ldb, (long long)stride_b, a, ab, (int)lda,
                        (long long)stride_a, &beta, c, CUDA_R_32F, (int)ldc,
                        (long long)stride_c, (int)batch, compute, CUBLAS_GEMM_DEFAULT));
    return DMRT_OK;
}

int dmrt_gpu_sgemm(dmrt_gpu *g, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                   const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                   float *c, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
                   int64_t stride_c) {
    return dmrt_gpu_gemm_ex(g, "dmrt_gpu_sgemm", CUDA_R_32F, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc, batch,
                   stride_a, stride_b, stride_c);
}

int dmrt_gpu_gemm_half(dmrt_gpu *g, int bf16, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                       int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c) {
    return dmrt_gpu_gemm_ex(g, "dmrt_gpu_gemm_half", bf16 ? CUDA_R_16BF : CUDA_R_16F, trans_a, trans_b, m, n, k, a, lda, b, ldb,
                   beta, c, ldc, batch, stride_a, stride_b, stride_c);
}

/* ---- the context ------------------------------------------------------------------------- */

/* DMRT_CUDA_DEVICE, else the world rank modulo the devices. -1 with err on a bad value. */
static int choose_device(dmrt_rank *rank, int count, char *err, size_t errlen) {
    const char *env = getenv("DMRT_CUDA_DEVICE");
    if (env && *env) {
        char *end = NULL;
        long d = strtol(env, &end, 10);
        if (*end || d < 0 || d >= count) {
            snprintf(err, errlen, "DMRT_CUDA_DEVICE=%s: not a device number in [0, %d)", env,
                     count);
            return -1;
        }
        return (int)d;
    }
    return rank ? dmrt_rank_id(rank) % count : 0;
}

/* DMRT_GPU_COMM, else the options; AUTO picks NCCL when every rank can have a GPU of its
 * own (NCCL refuses two ranks on one GPU). DMRT_CUDA_DEVICE puts every thread rank of a
 * process on one device, so there AUTO stages. *asked: NCCL was asked for rather than
 * chosen by AUTO (then axes of size 1 get an NCCL communicator too). */
static int choose_comm(dmrt_rank *rank, const dmrt_gpu_options *o, int count,
                       dmrt_gpu_comm_mode *mode, int *asked, char *err, size_t errlen) {
    const char *env = getenv("DMRT_GPU_COMM");
    dmrt_gpu_comm_mode m = o ? o->comm : DMRT_GPU_COMM_AUTO;
    if (env && *env) {
        if (strcmp(env, "nccl") == 0) m = DMRT_GPU_COMM_NCCL;
        else if (strcmp(env, "staged") == 0) m = DMRT_GPU_COMM_STAGED;
        else {
            snprintf(err, errlen, "DMRT_GPU_COMM=%s: expected nccl or staged", env);
            return -1;
        }
    }
    *asked = m == DMRT_GPU_COMM_NCCL;
    if (m == DMRT_GPU_COMM_AUTO) {
        const char *dev = getenv("DMRT_CUDA_DEVICE");
        int one_device = dev && *dev && rank && strcmp(dmrt_rank_backend(rank), "threads") == 0;
        m = rank && dmrt_rank_count(rank) <= count && !(one_device && dmrt_rank_count(rank) > 1)
                ? DMRT_GPU_COMM_NCCL
                : DMRT_GPU_COMM_STAGED;
    }
    if (!rank) m = DMRT_GPU_COMM_STAGED;  /* serial: nothing to communicate */
    if (m != DMRT_GPU_COMM_NCCL) *asked = 0;
    *mode = m;
    return 0;
}

static int open_device(dmrt_gpu *g) {
    CUDA_CHECK(g, cudaSetDevice(g->device));
    cudaDeviceProp prop;
    CUDA_CHECK(g, cudaGetDeviceProperties(&prop, g->device));
    snprintf(g->name, sizeof g->name, "%s (device %d)", prop.name, g->device);
    /* non-blocking: no implicit ordering with the legacy default stream that other code
     * in the process may use */
    CUDA_CHECK(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUDA_CHECK(g, cudaStreamCreateWithFlags(&g->comm_stream, cudaStreamNonBlocking));
    CUDA_CHECK(g, cudaEventCreateWithFlags(&g->start_event, cudaEventDisableTiming));
    CUDA_CHECK(g, cudaEventCreateWithFlags(&g->wait_event, cudaEventDisableTiming));
    CUBLAS_CHECK(g, cublasCreate(&g->cublas));
    CUBLAS_CHECK(g, cublasSetStream(g->cublas, g->stream));
    /* Strict fp32 unless asked: the compute type of each product says the rest. */
    CUBLAS_CHECK(g, cublasSetMathMode(g->cublas, g->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                         : CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(g, cudaEventCreateWithFlags(&g->upload_event, cudaEventDisableTiming));
    void *f = NULL;
    int rc = device_malloc(g, &f, sizeof(gpu_step_record));
    if (rc != DMRT_OK) return rc;
    g->record = (gpu_step_record *)f;
    g->fault = &g->record->fault;
    CUDA_CHECK(g, cudaMallocHost(&f, sizeof(gpu_step_record)));
    g->host_record = (gpu_step_record *)f;
    rc = device_malloc(g, &f, (size_t)DMRT_CUDA_SUM_PARTIALS_FLOATS * sizeof(float));
    if (rc != DMRT_OK) return rc;
    g->sum_partials = (float *)f;
    CUDA_CHECK(g, cudaMemsetAsync(g->record, 0, sizeof(gpu_step_record), g->stream));
    CUDA_CHECK(g, cudaStreamSynchronize(g->stream));
    return DMRT_OK;
}

dmrt_gpu *dmrt_gpu_create(dmrt_rank *rank, const dmrt_gpu_options *options, char *err,
                          size_t errlen) {
    char scratch_err[8];
    if (!err || errlen == 0) {
        err = scratch_err;
        errlen = sizeof scratch_err;
    }
    err[0] = 0;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "no CUDA device: %s",
                 e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
        return NULL;
    }
    int device = choose_device(rank ? rank : options ? options->beside : NULL, count, err, errlen);
    dmrt_gpu_comm_mode mode;
    int nccl_asked = 0;
    if (device < 0 || choose_comm(rank, options, count, &mode, &nccl_asked, err, errlen) != 0)
        return NULL;

    dmrt_gpu *g = (dmrt_gpu *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    g->device = device;
    g->rank = rank;
    g->tf32 = options ? options->tf32 : 0;
    g->comm_mode = mode;
    g->nccl_every_axis = nccl_asked;
    snprintf(g->name, sizeof g->name, "device %d", device);
    if (open_device(g) != DMRT_OK) {
        snprintf(err, errlen, "%s: %s", g->name, g->error);
        dmrt_gpu_destroy(g);
        return NULL;
    }
    if (mode == DMRT_GPU_COMM_NCCL && dmrt_gpu_nccl_init(g) != DMRT_OK) {
        snprintf(err, errlen, "NCCL: %s", g->error);
        dmrt_gpu_destroy(g);
        return NULL;
    }
    return g;
}

void dmrt_gpu_destroy(dmrt_gpu *g) {
    if (!g) return;
    /* Best effort: a failed step may have left errors behind; everything is freed anyway. */
    (void)cudaSetDevice(g->device);
    if (g->stream) (void)cudaStreamSynchronize(g->stream);
    if (g->comm_stream) (void)cudaStreamSynchronize(g->comm_stream);
    dmrt_gpu_nccl_destroy(g);
    dmrt_gpu_sdpa_destroy(g);
    dmrt_gpu_lt_destroy(g);
    if (g->cublas) (void)cublasDestroy(g->cublas);
    for (int i = 0; i < g->n_allocs; i++) (void)cudaFree(g->allocs[i].p);
    if (g->staging) (void)cudaFreeHost(g->staging);
    if (g->upload) (void)cudaFreeHost(g->upload);
    if (g->host_record) (void)cudaFreeHost(g->host_record);
    if (g->upload_event) (void)cudaEventDestroy(g->upload_event);
    if (g->start_event) (void)cudaEventDestroy(g->start_event);
    if (g->wait_event) (void)cudaEventDestroy(g->wait_event);
    if (g->comm_stream) (void)cudaStreamDestroy(g->comm_stream);
    if (g->stream) (void)cudaStreamDestroy(g->stream);
    (void)cudaGetLastError();
    free(g->allocs);
    free(g);
}
