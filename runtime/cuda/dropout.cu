/* dropout.cu: dropout's mask on the GPU, element by element, as the C target draws it: the
 * element's index in the step's whole tensor (dmrt_dropout_index) and its Philox block
 * (dmrt_philox_dropout_keep) come from runtime/dmrt_philox.h, which both targets compile;
 * the kept element is multiplied by the scale in one rounding, as the C target's
 * `x * scale` is. */
#include "gpu_internal.h"

#include "dmrt_philox.h"

__global__ static void dropout_kernel(const float *x, float *out, int64_t n, dmrt_dropout_shape shape, uint64_t first,
                                      uint64_t seed, int64_t step, uint32_t op, uint32_t threshold, float scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t index = dmrt_dropout_index(&shape, first, i);
        out[i] = dmrt_philox_dropout_keep(seed, step, op, index, threshold) ? __fmul_rn(x[i], scale) : 0.0f;
    }
}

int dmrt_gpu_dropout(dmrt_gpu *g, const float *x, float *out, int64_t n, const dmrt_dropout_shape *shape, uint64_t first,
                     uint64_t seed, int64_t step, uint32_t op, uint32_t threshold, float scale) {
    GPU_ENTER(g);
    ARG_CHECK(g, n >= 0 && shape && shape->levels >= 1 && shape->levels <= DMRT_DROPOUT_MAX_LEVELS);
    if (n == 0) return DMRT_OK;
    dropout_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(x, out, n, *shape, first, seed, step, op, threshold, scale);
    LAUNCH_CHECK(g, "dropout_kernel");
    return DMRT_OK;
}
