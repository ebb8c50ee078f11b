/* cuda_emu.cpp: the CPU emulation's kernel runner and its stand-ins for the CUDA runtime,
 * cuBLAS, cuBLASLt, NCCL and cuDNN, as far as libdmrt_cuda calls them (cuda_emu.h says
 * the model). "Device" memory is host memory that cudaMalloc hands out filled with 0xff
 * bytes (NaN floats, so that a read of memory nothing wrote shows), and every copy and
 * memset must lie inside one allocation of the side it names: a host pointer passed as a
 * device one, or a copy past an allocation's end, fails as cudaErrorInvalidValue. The
 * products are OpenBLAS's sgemm on widened operands (int8: loops summing in int32); TF32
 * runs as fp32. NCCL and cuDNN report themselves absent, so the runtime takes its staged
 * collectives and its own attention. */
/* the fibers jump between stacks: fortified longjmp would take that for a corrupt frame */
#undef _FORTIFY_SOURCE
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <cblas.h>
#include <cudnn.h>

#include <map>
#include <mutex>
#include <vector>

/* Under valgrind the fibers' stacks are registered as stacks, or its memcheck takes their
 * switches for wild stack-pointer moves (tests/gpu/emu: valgrind as a memcheck) */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define EMU_STACK_REGISTER(start, end) VALGRIND_STACK_REGISTER(start, end)
#define EMU_STACK_DEREGISTER(id) VALGRIND_STACK_DEREGISTER(id)
#endif
#endif
#ifndef EMU_STACK_REGISTER
#define EMU_STACK_REGISTER(start, end) 0u
#define EMU_STACK_DEREGISTER(id) ((void)(id))
#endif

#include "cuda_emu.h"

thread_local dmemu_thread dmemu_now;

/* ---- the kernel runner ------------------------------------------------------------------ */

namespace {

enum fiber_state { FIBER_READY, FIBER_AT_BARRIER, FIBER_DONE };

/* A fiber starts from its ucontext (makecontext: a stack of its own) and is switched
 * with _setjmp/_longjmp afterwards, which unlike swapcontext make no system call. */
struct fiber {
    ucontext_t context;
    jmp_buf jump;
    fiber_state state;
    bool started;
};

/* The block running now (NULL outside a launch); fibers only where the kernel needs them. */
struct block_run {
    const char *kernel;
    const std::function<void()> *body;
    int fibers_on;
    int current;
    std::vector<fiber> fibers;
    std::vector<uint64_t> lanes;
    jmp_buf scheduler;
};

thread_local block_run *running = NULL;
thread_local char *stacks = NULL;
thread_local size_t stacks_bytes = 0;
thread_local std::vector<unsigned> stack_ids;  /* valgrind's, one a fiber stack */
const size_t STACK_BYTES = 128 * 1024;

void stop(const char *what, const char *kernel) {
    fprintf(stderr, "cuda_emu: %s (kernel %s)\n", what, kernel ? kernel : "?");
    abort();
}

void set_thread(unsigned linear) {
    const dim3 d = dmemu_now.block_dim;
    dmemu_now.linear = linear;
    dmemu_now.thread_idx = make_uint3(linear % d.x, linear / d.x % d.y, linear / (d.x * d.y));
}

void fiber_main(void) {
    block_run *b = running;
    (*b->body)();
    b->fibers[(size_t)b->current].state = FIBER_DONE;
    _longjmp(b->scheduler, 1);
}

/* Runs fiber f until its next barrier or its end. */
void resume(block_run *b, fiber *f) {
    if (_setjmp(b->scheduler)) return;
    if (f->started) _longjmp(f->jump, 1);
    f->started = true;
    setcontext(&f->context);
    stop("setcontext failed", b->kernel);
}

/* The threads of one block as fibers, each run to its next barrier in turn: a barrier is
 * passed when every thread has reached it. */
void run_block_as_fibers(block_run *b, unsigned threads) {
    if (stacks_bytes < threads * STACK_BYTES) {
        for (unsigned id : stack_ids) EMU_STACK_DEREGISTER(id);
        stack_ids.clear();
        free(stacks);
        stacks_bytes = threads * STACK_BYTES;
        stacks = (char *)malloc(stacks_bytes);
        if (!stacks) stop("no memory for the fibers' stacks", b->kernel);
        for (unsigned t = 0; t < threads; t++)
            stack_ids.push_back(EMU_STACK_REGISTER(stacks + t * STACK_BYTES, stacks + (t + 1) * STACK_BYTES));
    }
    b->fibers.assign(threads, fiber());
    b->lanes.assign(threads, 0);
    for (unsigned t = 0; t < threads; t++) {
        fiber *f = &b->fibers[t];
        if (getcontext(&f->context) != 0) stop("getcontext failed", b->kernel);
        f->context.uc_stack.ss_sp = stacks + t * STACK_BYTES;
        f->context.uc_stack.ss_size = STACK_BYTES;
        f->context.uc_link = NULL;  /* fiber_main never returns */
        makecontext(&f->context, fiber_main, 0);
        f->state = FIBER_READY;
        f->started = false;
    }
    for (;;) {
        unsigned done = 0, waiting = 0;
        for (unsigned t = 0; t < threads; t++) {
            fiber *f = &b->fibers[t];
            if (f->state == FIBER_DONE) continue;
            f->state = FIBER_READY;
            b->current = (int)t;
            set_thread(t);
            resume(b, f);
        }
        for (unsigned t = 0; t < threads; t++) {
            done += b->fibers[t].state == FIBER_DONE;
            waiting += b->fibers[t].state == FIBER_AT_BARRIER;
        }
        if (done == threads) return;
        if (done > 0 && waiting > 0) stop("some threads of a block returned while others wait at a barrier", b->kernel);
    }
}

}  // namespace

void dmemu_run(int needs_block, const char *kernel, dim3 grid, dim3 block, const std::function<void()> &body) {
    const unsigned threads = block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024)
        stop("a launch with no blocks, no threads or over 1024 threads", kernel);
    if (needs_block && threads % 32 != 0) stop("a block of partial warps in a kernel that shuffles", kernel);
    block_run b;
    b.kernel = kernel;
    b.body = &body;
    b.fibers_on = needs_block;
    b.current = 0;
    block_run *outer = running;
    running = &b;
    dmemu_now.grid_dim = grid;
    dmemu_now.block_dim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                dmemu_now.block_idx = make_uint3(x, y, z);
                if (needs_block) {
                    run_block_as_fibers(&b, threads);
                    continue;
                }
                for (unsigned t = 0; t < threads; t++) {
                    set_thread(t);
                    body();
                }
            }
    running = outer;
}

void dmemu_barrier(void) {
    block_run *b = running;
    if (!b) stop("__syncthreads outside a kernel", NULL);
    if (!b->fibers_on) {
        if (dmemu_now.block_dim.x * dmemu_now.block_dim.y * dmemu_now.block_dim.z == 1) return;
        stop("a kernel synchronizes its block but was run thread after thread: declare its "
             "shared memory in its body (rewrite_launches.py)", b->kernel);
    }
    fiber *f = &b->fibers[(size_t)b->current];
    f->state = FIBER_AT_BARRIER;
    if (!_setjmp(f->jump)) _longjmp(b->scheduler, 1);
}

void *dmemu_lane_slot(int thread) {
    block_run *b = running;
    if (!b || !b->fibers_on || thread < 0 || (size_t)thread >= b->lanes.size())
        stop("a warp shuffle outside a block run as fibers", b ? b->kernel : NULL);
    return &b->lanes[(size_t)thread];
}

/* ---- memory ----------------------------------------------------------------------------- */

namespace {

std::mutex memory_lock;
std::map<uintptr_t, size_t> device_blocks, pinned_blocks;  /* start -> bytes */
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}

}  // namespace

/* A handle the library only passes back (a stream, an event, a cuBLAS handle): a byte of
 * its own, so that handles differ and a double free shows. */
template <typename H>
static H new_handle() {
    H h = (H)malloc(1);
    if (!h) abort();
    return h;
}
template <typename H>
static void free_handle(H h) {
    free((void *)h);
}

namespace {

/* Whether [p, p + bytes) lies inside one block of `blocks`. */
bool inside(const std::map<uintptr_t, size_t> &blocks, const void *p, size_t bytes) {
    std::lock_guard<std::mutex> hold(memory_lock);
    uintptr_t at = (uintptr_t)p;
    auto it = blocks.upper_bound(at);
    if (it == blocks.begin()) return false;
    --it;
    return at >= it->first && at + bytes <= it->first + it->second;
}

bool on_device(const void *p, size_t bytes) { return inside(device_blocks, p, bytes); }

cudaError_t allocate(std::map<uintptr_t, size_t> &blocks, void **p, size_t bytes) {
    if (!p) return fail(cudaErrorInvalidValue);
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return fail(cudaErrorMemoryAllocation);
    memset(*p, 0xff, bytes);
    std::lock_guard<std::mutex> hold(memory_lock);
    blocks[(uintptr_t)*p] = bytes;
    return cudaSuccess;
}

cudaError_t release(std::map<uintptr_t, size_t> &blocks, void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> hold(memory_lock);
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end()) return fail(cudaErrorInvalidValue);
    blocks.erase(it);
    free(p);
    return cudaSuccess;
}

}  // namespace

cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU emulation");
    prop->major = 9;
    prop->multiProcessorCount = 1;
    prop->totalGlobalMem = (size_t)1 << 34;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    *free_bytes = *total = (size_t)1 << 34;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument (emulation: a pointer outside its allocations)";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "an error of the CPU emulation";
    }
}

cudaError_t cudaMalloc(void **p, size_t bytes) { return allocate(device_blocks, p, bytes); }
cudaError_t cudaFree(void *p) { return release(device_blocks, p); }
cudaError_t cudaMallocHost(void **p, size_t bytes) { return allocate(pinned_blocks, p, bytes); }
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    return allocate(pinned_blocks, p, bytes);
}
cudaError_t cudaFreeHost(void *p) { return release(pinned_blocks, p); }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr, const void *p) {
    memset(attr, 0, sizeof *attr);
    attr->type = on_device(p, 1) ? cudaMemoryTypeDevice
                 : inside(pinned_blocks, p, 1) ? cudaMemoryTypeHost
                                               : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    (void)stream;
    if (bytes == 0) return cudaSuccess;
    /* cudaMemcpyDefault: each side where its pointer lies */
    bool dst_device = kind == cudaMemcpyDefault ? on_device(dst, 1)
                                                : kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool src_device = kind == cudaMemcpyDefault ? on_device(src, 1)
                                                : kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_device && !on_device(dst, bytes)) || (src_device && !on_device(src, bytes)) ||
        (!dst_device && on_device(dst, 1)) || (!src_device && on_device(src, 1)))
        return fail(cudaErrorInvalidValue);
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream) {
    (void)stream;
    if (bytes == 0) return cudaSuccess;
    if (!on_device(p, bytes)) return fail(cudaErrorInvalidValue);
    memset(p, value, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height, cudaStream_t stream) {
    (void)stream;
    if (width == 0 || height == 0) return cudaSuccess;
    if (width > pitch || !on_device(p, pitch * (height - 1) + width)) return fail(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) memset((char *)p + r * pitch, value, width);
    return cudaSuccess;
}

/* Streams and events: every call has finished when it returns. */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new_handle<cudaStream_t>();
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free_handle(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) {
    *e = new_handle<cudaEvent_t>();
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free_handle(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

/* ---- products ---------------------------------------------------------------------------- */

namespace {

float load(const void *p, cudaDataType_t t, size_t i) {
    switch (t) {
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

void store(void *p, cudaDataType_t t, size_t i, float v) {
    switch (t) {
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half(v); break;
    default: ((float *)p)[i] = v;
    }
}

bool float_type(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF || t == CUDA_R_16F; }
size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_32I ? 4 : t == CUDA_R_8I ? 1 : 2; }

/* Element (i, p) of op(X), X column-major with leading dimension ld. */
size_t at(cublasOperation_t op, int64_t i, int64_t p, int64_t ld) {
    return (size_t)(op == CUBLAS_OP_N ? i + p * ld : p + i * ld);
}

/* Whether the (m x k, column-major, op) operand lies in one device allocation. */
bool operand_on_device(const void *x, cudaDataType_t t, cublasOperation_t op, int64_t rows, int64_t cols, int64_t ld) {
    if (rows == 0 || cols == 0) return true;
    int64_t stored_rows = op == CUBLAS_OP_N ? rows : cols, stored_cols = op == CUBLAS_OP_N ? cols : rows;
    if (ld < stored_rows) return false;
    return on_device(x, (size_t)((stored_cols - 1) * ld + stored_rows) * type_bytes(t));
}

/* Operand x (rows x cols stored, leading dimension ld) as floats: x itself when it is
 * fp32, else widened into `widened`. */
const float *as_floats(const void *x, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, std::vector<float> &widened) {
    if (t == CUDA_R_32F || rows == 0 || cols == 0) return (const float *)x;
    widened.assign((size_t)((cols - 1) * ld + rows), 0.0f);
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) widened[(size_t)(i + j * ld)] = load(x, t, (size_t)(i + j * ld));
    return widened.data();
}

CBLAS_TRANSPOSE blas_op(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

/* C (m x n) = alpha op(A) op(B) + beta C, float types: 16-bit operands widened exactly,
 * the product OpenBLAS's sgemm (fp32 throughout; the order of its sums is not cuBLAS's,
 * which no caller may rely on), a 16-bit C rounded once at the end. beta = 0 ignores C. */
cublasStatus_t float_gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const void *a, cudaDataType_t at_, int64_t lda, const void *b, cudaDataType_t bt, int64_t ldb,
                          float beta, void *c, cudaDataType_t ct, int64_t ldc) {
    if (!float_type(at_) || !float_type(bt) || !float_type(ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!operand_on_device(a, at_, ta, m, k, lda) || !operand_on_device(b, bt, tb, k, n, ldb) ||
        !operand_on_device(c, ct, CUBLAS_OP_N, m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    std::vector<float> wa, wb, wc;
    const float *fa = as_floats(a, at_, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda, wa);
    const float *fb = as_floats(b, bt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb, wb);
    float *fc = ct == CUDA_R_32F ? (float *)c : (float *)as_floats(c, ct, m, n, ldc, wc);
    if (beta == 0.0f)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) fc[i + j * ldc] = 0.0f;
    if (k > 0)
        cblas_sgemm(CblasColMajor, blas_op(ta), blas_op(tb), (blasint)m, (blasint)n, (blasint)k, alpha, fa,
                    (blasint)(lda > 0 ? lda : 1), fb, (blasint)(ldb > 0 ? ldb : 1), beta, fc, (blasint)ldc);
    else
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) fc[i + j * ldc] *= beta;
    if (ct != CUDA_R_32F)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) store(c, ct, (size_t)(i + j * ldc), fc[i + j * ldc]);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t int8_gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, int32_t alpha,
                         const int8_t *a, int64_t lda, const int8_t *b, int64_t ldb, int32_t beta, int32_t *c, int64_t ldc) {
    if (!operand_on_device(a, CUDA_R_8I, ta, m, k, lda) || !operand_on_device(b, CUDA_R_8I, tb, k, n, ldb) ||
        !operand_on_device(c, CUDA_R_32I, CUBLAS_OP_N, m, n, ldc))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            int32_t acc = 0;
            for (int64_t p = 0; p < k; p++) acc += (int32_t)a[at(ta, i, p, lda)] * (int32_t)b[at(tb, p, j, ldb)];
            int32_t *o = c + i + j * ldc;
            *o = beta == 0 ? alpha * acc : alpha * acc + beta * *o;
        }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t gemm_ex(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void *alpha, const void *a,
                       cudaDataType_t at_, int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta, void *c,
                       cudaDataType_t ct, int ldc, cublasComputeType_t compute) {
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (compute == CUBLAS_COMPUTE_32I) {
        if (at_ != CUDA_R_8I || bt != CUDA_R_8I || ct != CUDA_R_32I) return CUBLAS_STATUS_NOT_SUPPORTED;
        return int8_gemm(ta, tb, m, n, k, *(const int32_t *)alpha, (const int8_t *)a, lda, (const int8_t *)b, ldb,
                         *(const int32_t *)beta, (int32_t *)c, ldc);
    }
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    return float_gemm(ta, tb, m, n, k, *(const float *)alpha, a, at_, lda, b, bt, ldb, *(const float *)beta, c, ct, ldc);
}

}  // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = new_handle<cublasHandle_t>();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    free_handle(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (emulation: bad sizes or an operand outside its allocation)";
    default: return "a cuBLAS error of the CPU emulation";
    }
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *a, cudaDataType_t at_, int lda, const void *b, cudaDataType_t bt,
                            int ldb, const void *beta, void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
    (void)h, (void)algo;
    return gemm_ex(ta, tb, m, n, k, alpha, a, at_, lda, b, bt, ldb, beta, c, ct, ldc, compute);
}
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *a, cudaDataType_t at_, int lda, long long stride_a,
                                          const void *b, cudaDataType_t bt, int ldb, long long stride_b, const void *beta,
                                          void *c, cudaDataType_t ct, int ldc, long long stride_c, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h, (void)algo;
    for (int i = 0; i < batch; i++) {
        cublasStatus_t s = gemm_ex(ta, tb, m, n, k, alpha, (const char *)a + i * stride_a * type_bytes(at_), at_, lda,
                                   (const char *)b + i * stride_b * type_bytes(bt), bt, ldb, beta,
                                   (char *)c + i * stride_c * type_bytes(ct), ct, ldc, compute);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* cuBLASLt: a matmul description's transposes, epilogue (none, BIAS or BGRADA) and bias
 * vector; layouts column-major, one matrix each. */
namespace {
struct lt_desc {
    cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void *bias = NULL;
};
struct lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = new_handle<cublasLtHandle_t>();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free_handle(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = (cublasLtMatmulDesc_t)(void *)new lt_desc();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete (lt_desc *)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t what, const void *buf,
                                              size_t bytes) {
    lt_desc *e = (lt_desc *)(void *)d;
    switch (what) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
        if (bytes != sizeof e->trans_a) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&e->trans_a, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if (bytes != sizeof e->trans_b) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&e->trans_b, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (bytes != sizeof e->epilogue) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&e->epilogue, buf, bytes);
        if (e->epilogue != CUBLASLT_EPILOGUE_DEFAULT && e->epilogue != CUBLASLT_EPILOGUE_BIAS &&
            e->epilogue != CUBLASLT_EPILOGUE_BGRADA)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (bytes != sizeof e->bias) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&e->bias, buf, bytes);
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;
    *l = (cublasLtMatrixLayout_t)(void *)new lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete (lt_layout *)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = new_handle<cublasLtMatmulPreference_t>();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free_handle(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t,
                                                    const void *, size_t) {
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int wanted, cublasLtMatmulHeuristicResult_t *results,
                                              int *found) {
    (void)h, (void)d, (void)a, (void)b, (void)c, (void)dl, (void)p;
    *found = 0;
    if (wanted < 1) return CUBLAS_STATUS_INVALID_VALUE;
    memset(&results[0], 0, sizeof results[0]);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t al, const void *b, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cl, void *dst, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes, cudaStream_t s) {
    (void)h, (void)algo, (void)workspace, (void)workspace_bytes, (void)s;
    const lt_desc *e = (const lt_desc *)(const void *)d;
    const lt_layout *la = (const lt_layout *)(const void *)al, *lb = (const lt_layout *)(const void *)bl;
    const lt_layout *lc = (const lt_layout *)(const void *)cl, *ld = (const lt_layout *)(const void *)dl;
    int64_t m = (int64_t)ld->rows, n = (int64_t)ld->cols;
    int64_t k = (int64_t)(e->trans_a == CUBLAS_OP_N ? la->cols : la->rows);
    if ((int64_t)(e->trans_a == CUBLAS_OP_N ? la->rows : la->cols) != m ||
        (int64_t)(e->trans_b == CUBLAS_OP_N ? lb->rows : lb->cols) != k ||
        (int64_t)(e->trans_b == CUBLAS_OP_N ? lb->cols : lb->rows) != n || lc->rows != ld->rows || lc->cols != ld->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (c != dst || lc->ld != ld->ld || lc->type != ld->type) return CUBLAS_STATUS_NOT_SUPPORTED;  /* as dmrt calls it */
    if (e->epilogue != CUBLASLT_EPILOGUE_DEFAULT && (!e->bias || !on_device(e->bias, (size_t)(m ? m : 1) * 4)))
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t st = float_gemm(e->trans_a, e->trans_b, m, n, k, *(const float *)alpha, a, la->type, la->ld, b, lb->type,
                                   lb->ld, *(const float *)beta, dst, ld->type, ld->ld);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    float *bias = (float *)e->bias;
    if (e->epilogue == CUBLASLT_EPILOGUE_BIAS)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                size_t o = (size_t)(i + j * ld->ld);
                store(dst, ld->type, o, load(dst, ld->type, o) + bias[i]);
            }
    if (e->epilogue == CUBLASLT_EPILOGUE_BGRADA)
        for (int64_t i = 0; i < m; i++) {
            float sum = 0.0f;
            for (int64_t p = 0; p < k; p++) sum += load(a, la->type, at(e->trans_a, i, p, la->ld));
            bias[i] = sum;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- NCCL and cuDNN: absent ------------------------------------------------------------- */

#define NCCL_ABSENT ncclSystemError
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    return NCCL_ABSENT;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int, ncclUniqueId, int) {
    *comm = NULL;
    return NCCL_ABSENT;
}
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t *e) {
    *e = ncclSuccess;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t) { return "NCCL is not emulated on the CPU"; }
const char *ncclGetLastError(ncclComm_t) { return "NCCL is not emulated on the CPU"; }
ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
ncclResult_t ncclAllReduce(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return NCCL_ABSENT;
}
ncclResult_t ncclAllGather(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) { return NCCL_ABSENT; }
ncclResult_t ncclReduceScatter(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return NCCL_ABSENT;
}
ncclResult_t ncclSend(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return NCCL_ABSENT; }
ncclResult_t ncclRecv(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return NCCL_ABSENT; }

extern "C" {
size_t cudnnGetVersion(void) { return 0; }
const char *cudnnGetErrorString(cudnnStatus_t) { return "cuDNN is not emulated on the CPU"; }
void cudnnGetLastErrorString(char *message, size_t max) {
    if (max) snprintf(message, max, "cuDNN is not emulated on the CPU");
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = NULL;
    return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_NOT_SUPPORTED; }
cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *d) {
    *d = NULL;
    return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t) { return CUDNN_STATUS_NOT_SUPPORTED; }
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                       int64_t, const void *) {
    return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t *count, void *) {
    if (count) *count = 0;
    return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) {
    return CUDNN_STATUS_NOT_SUPPORTED;
}
}
