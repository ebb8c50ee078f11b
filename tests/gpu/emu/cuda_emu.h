/* cuda_emu.h: what libdmrt_cuda's .cu files need to build as host C++ and run on the CPU
 * (docs/gpu.md, "The CPU emulation of libdmrt_cuda"). Force-included (-include) before a
 * file that rewrite_launches.py has turned into C++; cuda_emu.cpp supplies the CUDA
 * runtime, cuBLAS, cuBLASLt, NCCL and cuDNN calls the library makes, on host memory.
 *
 * The model: a launch runs its grid block after block, on the calling thread, before it
 * returns (every stream is synchronous). A kernel without shared memory runs its threads
 * one after another; one with shared memory (the block reductions: __syncthreads and
 * __shfl_xor_sync) runs each thread of a block as a fiber, switched at every barrier, so
 * that a barrier means what it means on the device. __shared__ is per OS thread (two thread
 * ranks may launch at once), shared by a block's fibers. Device arithmetic is the host's
 * IEEE float with no contraction (-ffp-contract=off), the _rn intrinsics exactly so.
 *
 * What this cannot show: data races between threads of a grid, timing, tensor-core
 * rounding (TF32), and anything of the real cuBLAS, NCCL or cuDNN (cuda_emu.cpp's products
 * are plain loops; NCCL and cuDNN report themselves absent). */
#ifndef DM_CUDA_EMU_H
#define DM_CUDA_EMU_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <stdint.h>
#include <string.h>

#include <functional>

/* The CUDA headers, compiled by a host compiler, give these as attributes it does not know. */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __forceinline__ inline
/* the runtime's device helpers (gpu_internal.h) are compiled as host code */
#define __CUDACC__ 1
#define DMRT_CUDA_EMULATED 1

/* The indices of the thread running now (set by the emulator before it runs one). */
struct dmemu_thread {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
    unsigned linear;  /* the thread's index in its block, x fastest (warps are runs of 32) */
};
extern thread_local dmemu_thread dmemu_now;
#define threadIdx (dmemu_now.thread_idx)
#define blockIdx (dmemu_now.block_idx)
#define blockDim (dmemu_now.block_dim)
#define gridDim (dmemu_now.grid_dim)

/* Runs body once for every thread of grid x block; needs_block: run each block's threads
 * as fibers (cuda_emu.cpp). */
void dmemu_run(int needs_block, const char *kernel, dim3 grid, dim3 block, const std::function<void()> &body);

template <typename Body>
static inline void dmemu_launch(int needs_block, const char *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                                cudaStream_t stream, Body body) {
    (void)shared_bytes;
    (void)stream;
    dmemu_run(needs_block, kernel, grid, block, std::function<void()>(body));
}

/* A barrier of the block running now; aborts outside a fiber block. */
void dmemu_barrier(void);
/* This thread's slot (8 bytes) for exchanging a warp's values, by linear thread index. */
void *dmemu_lane_slot(int thread);

static inline void __syncthreads(void) { dmemu_barrier(); }

/* Lanes exchange through per-thread slots, a barrier of the whole block around: valid
 * where every thread of the block shuffles together, as the block reductions do. */
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
    (void)mask;
    static_assert(sizeof(T) <= 8, "a lane's value fits its slot");
    int me = (int)dmemu_now.linear, partner = (me & ~31) | ((me & 31) ^ lane_mask);
    memcpy(dmemu_lane_slot(me), &v, sizeof v);
    dmemu_barrier();
    T r;
    memcpy(&r, dmemu_lane_slot(partner), sizeof r);
    dmemu_barrier();
    return r;
}

static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __int2float_rn(int a) { return (float)a; }
static inline float __double2float_rn(double a) { return (float)a; }

/* Threads run one at a time: plain reads and writes are atomic. */
static inline int atomicCAS(int *at, int compare, int value) {
    int old = *at;
    if (old == compare) *at = value;
    return old;
}
static inline unsigned long long atomicMax(unsigned long long *at, unsigned long long value) {
    unsigned long long old = *at;
    if (value > old) *at = value;
    return old;
}
static inline float atomicAdd(float *at, float value) {
    float old = *at;
    *at = old + value;
    return old;
}

#endif
