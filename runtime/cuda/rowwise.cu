/* rowwise.cu: the kernels that work along one dim of a tensor: softmax (with a fused
 * causal mask and scale) and its gradient, the causal mask, layernorm and its two
 * gradients. One block per row; the block's threads stride through the row and meet in
 * gpu_block_reduce. The C target's kernels (codegen/dialect_c.c) are the reference: the
 * same formulas and the same float/double choices, summed in another order. */
#include <math.h>

#include "dmrt_half.h"
#include "gpu_internal.h"

/* ---- softmax --------------------------------------------------------------------------- */

/* The row at (r, i) of an (outer, n, inner) tensor and how many of its keys take part:
 * with a fused causal mask, query r % causal_queries sees keys 0 .. q + n - queries. */
struct row_view {
    int64_t base, keys;
};

__device__ static row_view row_at(int64_t row, int64_t n, int64_t inner, int64_t causal_queries) {
    row_view v;
    const int64_t r = row / inner, i = row % inner;
    v.base = r * n * inner + i;
    v.keys = causal_queries ? r % causal_queries + (n - causal_queries + 1) : n;
    return v;
}

/* out = softmax(x * scale); max of the unscaled row, then exp(x * scale - max * scale), as
 * the C target (the same expression for scale 1, where it is exact). */
__global__ static void softmax_kernel(const float *x, float *out, int64_t rows, int64_t n,
                                      int64_t inner, float scale, int64_t causal_queries) {
    __shared__ float shared[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const row_view v = row_at(row, n, inner, causal_queries);
        const float *xr = x + v.base;
        float *o = out + v.base;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < v.keys; j += blockDim.x) mx = fmaxf(mx, xr[j * inner]);
        mx = gpu_block_reduce(mx, gpu_max_op(), shared);
        const float scaled_max = mx * scale;
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < v.keys; j += blockDim.x) {
            const float e = expf(xr[j * inner] * scale - scaled_max);
            o[j * inner] = e;
            sum += e;
        }
        sum = gpu_block_reduce(sum, gpu_sum_op(), shared);
        const float inv_sum = 1.0f / sum;
        /* each thread rescales the elements it wrote itself: no barrier needed */
        for (int64_t j = threadIdx.x; j < v.keys; j += blockDim.x) o[j * inner] *= inv_sum;
        for (int64_t j = v.keys + threadIdx.x; j < n; j += blockDim.x) o[j * inner] = 0.0f;
    }
}

/* out = scale * (y * (dy - sum(y * dy))); keys a fused mask hid get exactly 0. */
__global__ static void softmax_grad_kernel(const float *y, const float *dy, float *out,
                                           int64_t rows, int64_t n, int64_t inner, float scale,
                                           int64_t causal_queries) {
    __shared__ float shared[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const row_view v = row_at(row, n, inner, causal_queries);
        const float *yr = y + v.base, *dyr = dy + v.base;
        float *o = out + v.base;
        float dot = 0.0f;
        for (int64_t j = threadIdx.x; j < v.keys; j += blockDim.x) dot += yr[j * inner] * dyr[j * inner];
        dot = gpu_block_reduce(dot, gpu_sum_op(), shared);
        for (int64_t j = threadIdx.x; j < v.keys; j += blockDim.x)
            o[j * inner] = scale * (yr[j * inner] * (dyr[j * inner] - dot));
        for (int64_t j = v.keys + threadIdx.x; j < n; j += blockDim.x) o[j * inner] = 0.0f;
    }
}

static int check_rowwise(dmrt_gpu *g, const char *what, int64_t outer, int64_t n, int64_t inner,
                         int64_t causal_queries) {
    if (outer < 0 || n < 0 || inner < 0 || causal_queries < 0 ||
        (causal_queries > 0 && (inner != 1 || causal_queries > n)))
        return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                             "%s: bad shape outer=%lld n=%lld inner=%lld causal_queries=%lld "
                             "(a causal mask needs inner 1 and at least as many keys as queries)",
                             what, (long long)outer, (long long)n, (long long)inner,
                             (long long)causal_queries);
    return DMRT_OK;
}

int dmrt_gpu_softmax(dmrt_gpu *g, const float *x, float *out, int64_t outer, int64_t n,
                     int64_t inner, float scale, int64_t causal_queries) {
    GPU_ENTER(g);
    int rc = check_rowwise(g, "dmrt_gpu_softmax", outer, n, inner, causal_queries);
    if (rc != DMRT_OK) return rc;
    const int64_t rows = outer * inner;
    if (rows == 0 || n == 0) return DMRT_OK;
    softmax_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        x, out, rows, n, inner, scale, causal_queries);
    LAUNCH_CHECK(g, "softmax_kernel");
    return DMRT_OK;
}

int dmrt_gpu_softmax_grad(dmrt_gpu *g, const float *y, const float *dy, float *out,
                          int64_t outer, int64_t n, int64_t inner, float scale,
                          int64_t causal_queries) {
    GPU_ENTER(g);
    int rc = check_rowwise(g, "dmrt_gpu_softmax_grad", outer, n, inner, causal_queries);
    if (rc != DMRT_OK) return rc;
    const int64_t rows = outer * inner;
    if (rows == 0 || n == 0) return DMRT_OK;
    softmax_grad_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        y, dy, out, rows, n, inner, scale, causal_queries);
    LAUNCH_CHECK(g, "softmax_grad_kernel");
    return DMRT_OK;
}

/* ---- causal mask ------------------------------------------------------------------------- */

__global__ static void causal_mask_kernel(const float *x, float *out, int64_t total,
                                          int64_t queries, int64_t keys, float fill) {
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t key = idx % keys, query = (idx / keys) % queries;
        out[idx] = key > query + (keys - queries) ? fill : x[idx];
    }
}

int dmrt_gpu_causal_mask(dmrt_gpu *g, const float *x, float *out, int64_t outer,
                         int64_t queries, int64_t keys, float fill) {
    GPU_ENTER(g);
    ARG_CHECK(g, outer >= 0 && queries >= 0 && keys >= 0);
    const int64_t total = outer * queries * keys;
    if (total == 0) return DMRT_OK;
    causal_mask_kernel<<<gpu_blocks(total, 256), 256, 0, g->stream>>>(x, out, total, queries,
                                                                       keys, fill);
    LAUNCH_CHECK(g, "causal_mask_kernel");
    return DMRT_OK;
}

/* ---- layernorm ------------------------------------------------------------------------------ */

/* The row's mean and 1 / sqrt(biased variance + eps), summed in double as the C target. */
__device__ static void row_stats(const float *xr, int64_t n, float eps, double *shared,
                                 float *mean, float *rstd) {
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += (double)xr[j];
    s = gpu_block_reduce(s, gpu_sum_op(), shared);
    const float m = (float)(s / (double)n);
    double q = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const double d = (double)(xr[j] - m);
        q += d * d;
    }
    q = gpu_block_reduce(q, gpu_sum_op(), shared);
    *mean = m;
    *rstd = (float)(1.0 / sqrt(q / (double)n + (double)eps));
}

/* A result's 16-bit copy: bf16 or IEEE binary16 bits, rounded as the C target rounds. */
__device__ static inline uint16_t round16(float v, int bf16) {
    return bf16 ? dmrt_bf16_round(v) : dmrt_f16_round(v);
}

/* out = layernorm of x; with a and b (a residual add), x is made first as a + b, row by
 * row, and stored: the add's kernel is this one. out16: out's 16-bit copy too, or NULL. */
__global__ static void layernorm_kernel(const float *a, const float *b, float *x,
                                        const float *weight, const float *bias, float *out,
                                        uint16_t *out16, int bf16, int64_t rows, int64_t n,
                                        float eps) {
    __shared__ double shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float *xr = x + r * n;
        float *o = out + r * n;
        if (a) {
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
                xr[j] = __fadd_rn(a[r * n + j], b[r * n + j]);
            __syncthreads();
        }
        float mean, rstd;
        row_stats(xr, n, eps, shared, &mean, &rstd);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            o[j] = (xr[j] - mean) * rstd * weight[j] + bias[j];
            if (out16) out16[r * n + j] = round16(o[j], bf16);
        }
    }
}

/* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * weight; into
 * out, or added to it (accumulate: one rounded add, as a separate add kernel's). out16:
 * out's 16-bit copy too, or NULL. */
__global__ static void layernorm_grad_kernel(const float *x, const float *weight,
                                             const float *dy, float *out, int accumulate,
                                             uint16_t *out16, int bf16, int64_t rows, int64_t n,
                                             float eps) {
    __shared__ double shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * n, *dyr = dy + r * n;
        float *o = out + r * n;
        float mean, rstd;
        row_stats(xr, n, eps, shared, &mean, &rstd);
        double s = 0.0, sx = 0.0;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const float dxhat = dyr[j] * weight[j];
            s += (double)dxhat;
            sx += (double)dxhat * (double)((xr[j] - mean) * rstd);
        }
        s = gpu_block_reduce(s, gpu_sum_op(), shared);
        sx = gpu_block_reduce(sx, gpu_sum_op(), shared);
        const float mean_dxhat = (float)(s / (double)n);
        const float mean_dxhat_xhat = (float)(sx / (double)n);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
            const float dx = rstd * (dyr[j] * weight[j] - mean_dxhat - (xr[j] - mean) * rstd * mean_dxhat_xhat);
            o[j] = accumulate ? __fadd_rn(o[j], dx) : dx;
            if (out16) out16[r * n + j] = round16(o[j], bf16);
        }
    }
}

/* stats (rows, 2): each row's mean and rstd, for the column pass of wgrad. */
__global__ static void layernorm_stats_kernel(const float *x, float *stats, int64_t rows,
                                              int64_t n, float eps) {
    __shared__ double shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float mean, rstd;
        row_stats(x + r * n, n, eps, shared, &mean, &rstd);
        if (threadIdx.x == 0) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = rstd;
        }
    }
}

/* Column j of rows [chunk * per_chunk, ...): sum of dy * xhat in row order, with the C
 * target's roundings (no fused multiply-add), into sums[chunk * n + j]; and, when
 * bias_sums is given, the plain sum of dy the same way into bias_sums[chunk * n + j] (the
 * bias's gradient, read from the same dy). A fixed chunking and a fixed order: the same
 * bits on every run. */
__global__ static void layernorm_wgrad_kernel(const float *x, const float *dy,
                                              const float *stats, float *sums, float *bias_sums,
                                              int64_t rows, int64_t n, int64_t per_chunk) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= n) return;
    const int64_t first = blockIdx.y * per_chunk;
    const int64_t last = first + per_chunk < rows ? first + per_chunk : rows;
    float acc = 0.0f, acc_bias = 0.0f;
    for (int64_t r = first; r < last; r++) {
        const float d = dy[r * n + j];
        const float xhat = __fmul_rn(__fsub_rn(x[r * n + j], stats[2 * r]), stats[2 * r + 1]);
        acc = __fadd_rn(acc, __fmul_rn(d, xhat));
        acc_bias = __fadd_rn(acc_bias, d);
    }
    sums[blockIdx.y * n + j] = acc;
    if (bias_sums) bias_sums[blockIdx.y * n + j] = acc_bias;
}

/* out[j] = the chunks' sums of column j, in chunk order; bias_out likewise from
 * bias_sums, when given. */
__global__ static void column_sum_kernel(const float *sums, float *out, const float *bias_sums,
                                         float *bias_out, int64_t chunks, int64_t n) {
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= n) return;
    float acc = 0.0f, acc_bias = 0.0f;
    for (int64_t c = 0; c < chunks; c++) {
        acc = __fadd_rn(acc, sums[c * n + j]);
        if (bias_out) acc_bias = __fadd_rn(acc_bias, bias_sums[c * n + j]);
    }
    out[j] = acc;
    if (bias_out) bias_out[j] = acc_bias;
}

int dmrt_gpu_layernorm(dmrt_gpu *g, const float *x, const float *weight, const float *bias,
                       float *out, uint16_t *out16, int bf16, int64_t rows, int64_t n, float eps) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && n >= 0);
    if (rows == 0 || n == 0) return DMRT_OK;
    /* x is only read when no add makes it */
    layernorm_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        NULL, NULL, (float *)x, weight, bias, out, out16, bf16 != 0, rows, n, eps);
    LAUNCH_CHECK(g, "layernorm_kernel");
    return DMRT_OK;
}

int dmrt_gpu_add_layernorm(dmrt_gpu *g, const float *a, const float *b, float *x,
                           const float *weight, const float *bias, float *out, uint16_t *out16,
                           int bf16, int64_t rows, int64_t n, float eps) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && n >= 0 && a != NULL && b != NULL);
    if (rows == 0 || n == 0) return DMRT_OK;
    layernorm_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        a, b, x, weight, bias, out, out16, bf16 != 0, rows, n, eps);
    LAUNCH_CHECK(g, "layernorm_kernel");
    return DMRT_OK;
}

int dmrt_gpu_layernorm_grad(dmrt_gpu *g, const float *x, const float *weight, const float *dy,
                            float *out, int accumulate, uint16_t *out16, int bf16, int64_t rows,
                            int64_t n, float eps) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && n >= 0);
    if (rows == 0 || n == 0) return DMRT_OK;
    layernorm_grad_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        x, weight, dy, out, accumulate != 0, out16, bf16 != 0, rows, n, eps);
    LAUNCH_CHECK(g, "layernorm_grad_kernel");
    return DMRT_OK;
}

/* Row statistics first (one block per row), then columns summed over fixed chunks of
 * rows, then the chunks in order: deterministic, and parallel over rows and columns. The
 * bias's gradient (bias_out) rides along in the same passes over dy. */
int dmrt_gpu_layernorm_wgrad(dmrt_gpu *g, const float *x, const float *dy, float *out,
                             float *bias_out, int64_t rows, int64_t n, float eps, float *scratch) {
    GPU_ENTER(g);
    ARG_CHECK(g, rows >= 0 && n >= 0);
    if (n == 0) return DMRT_OK;
    if (rows == 0) {
        CUDA_CHECK(g, cudaMemsetAsync(out, 0, (size_t)n * sizeof(float), g->stream));
        if (bias_out) CUDA_CHECK(g, cudaMemsetAsync(bias_out, 0, (size_t)n * sizeof(float), g->stream));
        return DMRT_OK;
    }
    ARG_CHECK(g, scratch != NULL);
    /* 256 rows a chunk keeps enough blocks busy; at most 4096 chunks bounds the scratch
     * (and gridDim.y) for very tall inputs (dmrt_cuda_wgrad_chunks) */
    const int64_t chunks = dmrt_cuda_wgrad_chunks(rows);
    const int64_t per_chunk = (rows + chunks - 1) / chunks;
    const size_t stats_floats = 2 * (size_t)rows;
    float *stats = scratch;
    float *sums = chunks > 1 ? stats + stats_floats : out;
    float *bias_sums = !bias_out ? NULL : chunks > 1 ? sums + (size_t)chunks * (size_t)n : bias_out;

    layernorm_stats_kernel<<<gpu_row_blocks(rows), gpu_row_threads(n), 0, g->stream>>>(
        x, stats, rows, n, eps);
    LAUNCH_CHECK(g, "layernorm_stats_kernel");
    const int threads = 256;
    const dim3 grid((unsigned)((n + threads - 1) / threads), (unsigned)chunks);
    layernorm_wgrad_kernel<<<grid, threads, 0, g->stream>>>(x, dy, stats, sums, bias_sums, rows,
                                                            n, per_chunk);
    LAUNCH_CHECK(g, "layernorm_wgrad_kernel");
    if (chunks > 1) {
        column_sum_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, g->stream>>>(
            sums, out, bias_sums, bias_out, chunks, n);
        LAUNCH_CHECK(g, "column_sum_kernel");
    }
    return DMRT_OK;
}
