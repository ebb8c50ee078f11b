/* gpu_internal.h: what the files of libdmrt_cuda share and nothing else sees: the
 * dmrt_gpu struct, the checking macros around CUDA/cuBLAS/NCCL calls, launch shapes and
 * the block reductions of the row-wise kernels. Not installed. The dmrt_gpu_ functions
 * declared here cross files of the library only. */
#ifndef DMRT_GPU_INTERNAL_H
#define DMRT_GPU_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt_cuda.h"

/* The NCCL communicator of one mesh axis of the rank. */
typedef struct gpu_nccl_comm {
    dmrt_comm *comm;   /* the host communicator it mirrors (same members, same order) */
    ncclComm_t nccl;
    int pending;       /* allreduces started on comm_stream that no wait has covered yet */
} gpu_nccl_comm;

/* A live device allocation, for the peak counter (cudaFree does not say the size). */
typedef struct gpu_alloc {
    void *p;
    size_t bytes;
} gpu_alloc;

/* What a step's end reads back from the device in one copy (dmrt_gpu_step_end). */
typedef struct gpu_step_record {
    dmrt_fault fault;
    float loss;
} gpu_step_record;

struct dmrt_gpu {
    int device;
    dmrt_rank *rank;                /* NULL: a serial program */
    cudaStream_t stream;            /* every call of the rank, in call order */
    cudaStream_t comm_stream;       /* NCCL allreduces started to overlap later work */
    cudaEvent_t start_event;        /* on stream: where a started allreduce may begin */
    cudaEvent_t wait_event;         /* on comm_stream: what dmrt_gpu_comm_wait waits for */
    cublasHandle_t cublas;
    int tf32;                       /* matrix products may use TF32 tensor cores */
    dmrt_gpu_comm_mode comm_mode;   /* NCCL or STAGED once created, never AUTO */
    int nccl_every_axis;            /* NCCL was asked for (options or DMRT_GPU_COMM), not
                                       chosen by AUTO: axes of size 1 get NCCL too */
    char name[300];                 /* "NVIDIA H100 80GB HBM3 (device 0)" */
    char error[512];                /* the last failure, "file:line: call failed: why" */
    dmrt_fault *fault;              /* device: the first bad index since the last take
                                       (&record->fault) */
    gpu_step_record *record;        /* device: the fault and the step's loss, side by side
                                       for dmrt_gpu_step_end's one copy */
    gpu_step_record *host_record;   /* pinned host memory: where that copy lands */
    char *upload;                   /* pinned host memory for dmrt_gpu_upload (reserved) */
    size_t upload_bytes;
    cudaEvent_t upload_event;       /* on stream: after the last upload's copy */
    double *clip_partials;          /* device: clipping's squares, (clip_gradients) slots of
                                       the sum-of-squares kernel's block partials */
    float *clip_factor;             /* device: clip / (norm + 1e-6), after the partials */
    int clip_gradients;
    float *sum_partials;            /* device: DMRT_CUDA_SUM_PARTIALS_FLOATS chunk sums of
                                       generated reduction kernels */

    float *staging;                 /* pinned host memory for staged collectives */
    size_t staging_bytes;

    gpu_alloc *allocs;              /* (n_allocs) live device allocations */
    int n_allocs, cap_allocs;
    size_t bytes_in_use, peak_bytes;

    int n_nccl;
    gpu_nccl_comm nccl[DMRT_MESH_MAX_AXES];  /* (n_nccl) one per mesh axis of size > 1,
                                                of any size with nccl_every_axis */
    int nccl_aborted;               /* a deadline or peer failure aborted the NCCL comms */

    struct gpu_lt *lt;              /* gemm_epilogue.cu's cuBLASLt handle and plans; NULL
                                       until the first product with an epilogue */
    struct gpu_sdpa *sdpa;          /* attention16.cu's cuDNN handle and plans; NULL until
                                       the first 16-bit attention */
};

/* ---- errors ---------------------------------------------------------------------------- */

/* The library's own functions have C linkage, as its interface has: the archive exports
 * them under their plain dmrt_ names, not C++-mangled ones. */
extern "C" {

/* Writes "file:line: <message>" into g->error and returns status. */
int dmrt_gpu_fail(dmrt_gpu *g, int status, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

}  /* extern "C" */

/* A failed call also leaves CUDA's last error set; it is cleared so that the next launch
 * check does not report it again in the wrong place. */
#define CUDA_CHECK(g, call)                                                                  \
    do {                                                                                     \
        cudaError_t check_e_ = (call);                                                       \
        if (check_e_ != cudaSuccess) {                                                       \
            (void)cudaGetLastError();                                                        \
            return dmrt_gpu_fail((g), DMRT_ERR_DEVICE, __FILE__, __LINE__, "%s failed: %s",  \
                                 #call, cudaGetErrorString(check_e_));                       \
        }                                                                                    \
    } while (0)

#define CUBLAS_CHECK(g, call)                                                                \
    do {                                                                                     \
        cublasStatus_t check_s_ = (call);                                                    \
        if (check_s_ != CUBLAS_STATUS_SUCCESS)                                               \
            return dmrt_gpu_fail((g), DMRT_ERR_DEVICE, __FILE__, __LINE__, "%s failed: %s",  \
                                 #call, cublasGetStatusString(check_s_));                    \
    } while (0)

#define NCCL_CHECK(g, comm, call)                                                            \
    do {                                                                                     \
        ncclResult_t check_r_ = (call);                                                      \
        if (check_r_ != ncclSuccess)                                                         \
            return dmrt_gpu_fail((g), DMRT_ERR_DEVICE, __FILE__, __LINE__,                   \
                                 "%s failed: %s (%s)", #call, ncclGetErrorString(check_r_),  \
                                 ncclGetLastError(comm));                                    \
    } while (0)

/* After a <<<launch>>>: a bad configuration shows here, faults inside the kernel at the
 * next synchronisation. */
#define LAUNCH_CHECK(g, what)                                                                \
    do {                                                                                     \
        cudaError_t check_e_ = cudaGetLastError();                                           \
        if (check_e_ != cudaSuccess)                                                         \
            return dmrt_gpu_fail((g), DMRT_ERR_DEVICE, __FILE__, __LINE__,                   \
                                 "launch of %s failed: %s", (what),                          \
                                 cudaGetErrorString(check_e_));                              \
    } while (0)

/* Every entry point starts here: a rank's gpu may be used from a thread other than the
 * one that created it, and the current device is per thread. */
#define GPU_ENTER(g)                                                                         \
    do {                                                                                     \
        if (!(g)) return DMRT_ERR_ARG;                                                       \
        CUDA_CHECK((g), cudaSetDevice((g)->device));                                         \
    } while (0)

#define ARG_CHECK(g, cond)                                                                   \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return dmrt_gpu_fail((g), DMRT_ERR_ARG, __FILE__, __LINE__, "%s: bad argument: %s", \
                                 __func__, #cond);                                           \
    } while (0)

/* ---- shared services ------------------------------------------------------------------- */

extern "C" {

/* Pinned host memory of at least bytes; the stream must be idle (staged collectives
 * synchronise first). */
int dmrt_gpu_staging(dmrt_gpu *g, size_t bytes, float **p);
/* Waits for a stream. With NCCL, polls with the rank's deadline and aborts the NCCL
 * communicators when it passes or NCCL reports an error (no silent hang). */
int dmrt_gpu_wait_stream(dmrt_gpu *g, cudaStream_t s);
/* NCCL bootstrap over the rank's mesh axes (create), and teardown (destroy). */
int dmrt_gpu_nccl_init(dmrt_gpu *g);
void dmrt_gpu_nccl_destroy(dmrt_gpu *g);
/* The main stream waits (on the device) for every collective started on the comm stream
 * and not yet waited for: a step that failed between a start and its wait leaves one
 * writing its buffer, which the next step's kernels may reuse. */
int dmrt_gpu_nccl_join(dmrt_gpu *g);
/* attention16.cu's cuDNN plans and handle, freed (destroy). */
void dmrt_gpu_sdpa_destroy(dmrt_gpu *g);
/* gemm_epilogue.cu's cuBLASLt plans and handle, freed (destroy). */
void dmrt_gpu_lt_destroy(dmrt_gpu *g);
/* The products of dmrt_gpu_sgemm and dmrt_gpu_gemm_half (gpu.cu): a and b of type ab
 * (fp32, bf16 or fp16), c fp32, accumulated in fp32 (TF32 only for fp32 operands, where
 * the gpu was created with tf32); name is the caller's, for messages. */
int dmrt_gpu_gemm_ex(dmrt_gpu *g, const char *name, cudaDataType_t ab, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, float beta, float *c, int64_t ldc,
                     int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c);
/* DMRT_OK, or the failure naming name's sizes when one is negative or beyond cuBLAS's
 * 32-bit ints. */
int dmrt_gpu_gemm_sizes(dmrt_gpu *g, const char *name, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                        int64_t ldc, int64_t batch);

}  /* extern "C" */

/* ---- libraries with a fallback (cuDNN's attention, cuBLASLt's epilogues) ----------------
 *
 * What a call does where the library makes no plan for its shape, as an environment
 * variable (DMRT_CUDNN_ATTENTION, DMRT_CUBLASLT) says: auto (unset or empty) falls back to
 * the runtime's own kernels, saying so once on stderr; require fails instead; off always
 * falls back. */
typedef enum { GPU_LIBRARY_AUTO, GPU_LIBRARY_REQUIRE, GPU_LIBRARY_OFF } gpu_library_mode;

/* The mode the variable asks for; -1 for a value other than auto, require and off. */
static inline int gpu_library_mode_from_env(const char *variable) {
    const char *env = getenv(variable);
    if (!env || !*env || !strcmp(env, "auto")) return GPU_LIBRARY_AUTO;
    if (!strcmp(env, "require")) return GPU_LIBRARY_REQUIRE;
    if (!strcmp(env, "off")) return GPU_LIBRARY_OFF;
    return -1;
}

/* ---- launch shapes ----------------------------------------------------------------------- */

/* Grids are capped and kernels loop (grid-stride), so any count fits gridDim. */
#define GPU_MAX_BLOCKS ((int64_t)1 << 20)

static inline unsigned gpu_blocks(int64_t items, int threads) {
    int64_t b = (items + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b < GPU_MAX_BLOCKS ? b : GPU_MAX_BLOCKS);
}

static inline unsigned gpu_row_blocks(int64_t rows) {
    return (unsigned)(rows < GPU_MAX_BLOCKS ? (rows < 1 ? 1 : rows) : GPU_MAX_BLOCKS);
}

/* Threads of a block that works through one row of n elements: enough to keep a row's
 * loads wide, few enough that short rows do not idle most of the block. A multiple of
 * 32: the reductions below need whole warps. */
static inline int gpu_row_threads(int64_t n) {
    if (n >= 4096) return 512;
    if (n >= 1024) return 256;
    if (n >= 256) return 128;
    if (n >= 64) return 64;
    return 32;
}

/* ---- reductions (device) ------------------------------------------------------------------
 *
 * Every thread of the block must call them (no thread may have returned) and every one
 * gets the result. The order of operations depends only on blockDim, so a given launch
 * shape always gives the same bits. shared: 32 elements of the block's shared memory. */
#ifdef __CUDACC__
struct gpu_sum_op {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct gpu_max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ inline T gpu_block_reduce(T v, Op op, T *shared) {
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    __syncthreads();  /* the previous reduction's readers are done with shared */
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    T r = shared[0];
    for (int w = 1; w < warps; w++) r = op(r, shared[w]);
    return r;
}

/* Records a bad index for dmrt_gpu_fault_take or dmrt_gpu_step_end, deterministically
 * whatever the thread order: the first kernel with one claims the site (kernels of a
 * stream run in order),
 * and among its bad indices the lowest position wins, as in the C target's loop. On the
 * device, f->position holds ~(position << 32 | value) (0: none yet), so that atomicMax
 * keeps the lowest position; dmrt_gpu_fault_unpack undoes it (positions < 2^31). */
__device__ inline void gpu_record_fault(dmrt_fault *f, int site, int32_t value,
                                        int64_t position) {
    const int claimed = atomicCAS(&f->site, 0, site);
    if (claimed != 0 && claimed != site) return;
    const unsigned long long key = ((unsigned long long)position << 32) | (uint32_t)value;
    atomicMax((unsigned long long *)&f->position, ~key);
}
#endif

#endif
