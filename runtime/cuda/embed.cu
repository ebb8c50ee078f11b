/* embed.cu: embedding lookup and its deterministic gradient. The gradient sorts the
 * (table row, position) pairs with CUB's radix sort, which is stable, so each table row's
 * positions come out in increasing order; one block per run of equal rows then adds those
 * dy rows in that order, starting from 0: the C target's sums, bit for bit, with no
 * atomics. */
#include <limits.h>
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "dmrt_cuda_sizes.h"
#include "gpu_internal.h"

/* ---- forward ----------------------------------------------------------------------------- */

/* out[r] = table[ids[r] - first_row]; zeros for an id in another rank's window, and for
 * an id outside the vocabulary, which also records the fault. */
__global__ static void embed_kernel(const float *table, const int32_t *ids, float *out,
                                    int64_t rows, int64_t n, int64_t cols, int64_t vocab,
                                    int64_t first_row, dmrt_fault *fault, int site,
                                    int64_t position_base) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int32_t id = ids[r];
        const int bad = id < 0 || id >= vocab;
        if (bad && threadIdx.x == 0) gpu_record_fault(fault, site, id, position_base + r);
        const int64_t row = (int64_t)id - first_row;
        const float *src = !bad && row >= 0 && row < n ? table + row * cols : NULL;
        float *dst = out + r * cols;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) dst[j] = src ? src[j] : 0.0f;
    }
}

int dmrt_gpu_embed(dmrt_gpu *g, const float *table, const int32_t *ids, float *out,
                   int64_t rows, int64_t n, int64_t cols, int64_t vocab, int64_t first_row,
                   int site, int64_t position_base) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && n >= 0 && cols >= 0 && vocab >= 0 && first_row >= 0);
    if (rows == 0 || cols == 0) return DMRT_OK;
    embed_kernel<<<gpu_row_blocks(rows), gpu_row_threads(cols), 0, g->stream>>>(
        table, ids, out, rows, n, cols, vocab, first_row, g->fault, site, position_base);
    LAUNCH_CHECK(g, "embed_kernel");
    return DMRT_OK;
}

/* ---- backward ---------------------------------------------------------------------------- */

/* keys[i] = the table row of position i, or n (sorted last, then skipped) outside the
 * window; positions[i] = i. */
__global__ static void embed_keys_kernel(const int32_t *ids, unsigned *keys, int32_t *positions,
                                         int64_t rows, int64_t n, int64_t first_row) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = (int64_t)ids[i] - first_row;
        keys[i] = row >= 0 && row < n ? (unsigned)row : (unsigned)n;
        positions[i] = (int32_t)i;
    }
}

/* Block i starts at sorted index i; only the first index of a run of equal keys does
 * work: out[key] = 0 + dy[p0] + dy[p1] + ... over the run's positions, in order
 * (accumulate: out[key] + that sum). */
__global__ static void embed_segments_kernel(const unsigned *keys, const int32_t *positions,
                                             const float *dy, float *out, int64_t rows,
                                             int64_t n, int64_t cols, int accumulate) {
    for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
        const unsigned key = keys[i];
        if ((int64_t)key >= n || (i > 0 && keys[i - 1] == key)) continue;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            float acc = 0.0f;
            for (int64_t p = i; p < rows && keys[p] == key; p++)
                acc = __fadd_rn(acc, dy[(int64_t)positions[p] * cols + j]);
            float *at = out + (int64_t)key * cols + j;
            *at = accumulate ? __fadd_rn(*at, acc) : acc;
        }
    }
}

static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* CUB's temporary storage for sorting `rows` pairs on `end_bit` bits, on the current
 * device (CUB asks it for its architecture). */
static cudaError_t sort_temp_bytes(int rows, int end_bit, size_t *bytes) {
    cub::DoubleBuffer<unsigned> keys(NULL, NULL);
    cub::DoubleBuffer<int32_t> values(NULL, NULL);
    *bytes = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(NULL, *bytes, keys, values, rows, 0, end_bit);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return e;
}

/* The bound both sides agree on (dmrt_cuda_sizes.h): the compiler sizes the storage with
 * it, where CUB cannot be asked. */
size_t dmrt_gpu_embed_grad_scratch(int64_t rows) {
    return (size_t)dmrt_cuda_embed_grad_scratch_bytes(rows);
}

int dmrt_gpu_embed_grad(dmrt_gpu *g, const int32_t *ids, const float *dy, float *out,
                        int64_t rows, int64_t n, int64_t cols, int64_t first_row,
                        int accumulate, void *scratch) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && rows <= INT_MAX && n >= 0 && n < (int64_t)UINT_MAX &&
                     cols >= 0 && first_row >= 0);
    if (n == 0 || cols == 0) return DMRT_OK;
    if (!accumulate) CUDA_CHECK(g, cudaMemsetAsync(out, 0, (size_t)n * (size_t)cols * sizeof(float), g->stream));
    if (rows == 0) return DMRT_OK;
    ARG_CHECK(g, scratch != NULL);

    /* layout: 256 bytes to align the start, four arrays of rows 32-bit words (keys and
     * positions, each double-buffered for the sort), then CUB's storage */
    const size_t words = align256((size_t)rows * 4);
    char *base = (char *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    unsigned *keys0 = (unsigned *)base, *keys1 = (unsigned *)(base + words);
    int32_t *pos0 = (int32_t *)(base + 2 * words), *pos1 = (int32_t *)(base + 3 * words);
    void *temp = base + 4 * words;
    const size_t temp_room = dmrt_gpu_embed_grad_scratch(rows) - 256 - 4 * words;  /* > 0 */

    int end_bit = 1;  /* keys are 0 .. n */
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)n) end_bit++;
    size_t temp_bytes = 0;
    cudaError_t e = sort_temp_bytes((int)rows, end_bit, &temp_bytes);
    if (e != cudaSuccess)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "cub::DeviceRadixSort::SortPairs (sizing) failed: %s",
                             cudaGetErrorString(e));
    if (temp_bytes > temp_room)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "dmrt_gpu_embed_grad: CUB wants %zu bytes of sort storage for %lld "
                             "positions, the scratch (dmrt_cuda_sizes.h) has room for %zu",
                             temp_bytes, (long long)rows, temp_room);

    embed_keys_kernel<<<gpu_blocks(rows, 256), 256, 0, g->stream>>>(ids, keys0, pos0, rows, n,
                                                                    first_row);
    LAUNCH_CHECK(g, "embed_keys_kernel");
    cub::DoubleBuffer<unsigned> keys(keys0, keys1);
    cub::DoubleBuffer<int32_t> positions(pos0, pos1);
    CUDA_CHECK(g, cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, positions, (int)rows,
                                                  0, end_bit, g->stream));
    embed_segments_kernel<<<gpu_row_blocks(rows), gpu_row_threads(cols), 0, g->stream>>>(
        keys.Current(), positions.Current(), dy, out, rows, n, cols, accumulate);
    LAUNCH_CHECK(g, "embed_segments_kernel");
    return DMRT_OK;
}
