/* attention.cu: fused attention on the GPU (the CUDA target's attention op,
 * codegen/dialect_cuda.c): one thread per row of a head, each running
 * runtime/dmrt_attention_rows.h's function for its row, which the C test compiles too
 * (tests/runtime/test_attention_rows.c checks them against the C target's kernels). No
 * head's T x T scores are held: a forward row walks its keys with an online softmax, the
 * backward recomputes the probabilities from lse. Rows are independent, so the results do
 * not depend on the launch shape. A first kernel: correct and memory-lean, not tiled
 * through shared memory (issue 37's speed work starts from it). */
#include "gpu_internal.h"

#include "dmrt_attention_rows.h"

/* the (head, row) of thread `item` of heads x positions */
#define ATTENTION_ROW_LOOP(heads, positions)                                                                  \
    for (int64_t item = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; item < (heads) * (positions);       \
         item += (int64_t)gridDim.x * blockDim.x)

/* group: query heads per k and v head (1: plain multi-head attention); query head h reads
 * kv head h / group, and a thread of the dk/dv kernel takes a row of a kv head, summing
 * over its group. inner: the heads side by side in a row ([B, T, H, D], inner H; group 1),
 * head h's rows and lse found by dmrt_attention_head_at. */
__global__ static void attention_forward_kernel(const float *q, const float *k, const float *v, float *out, float *lse,
                                                int64_t heads, int64_t group, int64_t inner, int64_t positions,
                                                int64_t width, float scale, int causal) {
    ATTENTION_ROW_LOOP(heads, positions) {
        const int64_t h = item / positions, row = item % positions;
        const int64_t head = dmrt_attention_head_at(h, inner, positions, width);
        const int64_t kv_head = dmrt_attention_head_at(h / group, inner, positions, width);
        dmrt_attention_row_forward(q + head, k + kv_head, v + kv_head, out + head, lse + head / width, row, positions,
                                   width, inner, scale, causal);
    }
}

__global__ static void attention_dq_kernel(const float *q, const float *k, const float *v, const float *out,
                                           const float *lse, const float *dout, float *dq, int64_t heads,
                                           int64_t group, int64_t inner, int64_t positions, int64_t width, float scale,
                                           int causal) {
    ATTENTION_ROW_LOOP(heads, positions) {
        const int64_t h = item / positions, row = item % positions;
        const int64_t head = dmrt_attention_head_at(h, inner, positions, width);
        const int64_t kv_head = dmrt_attention_head_at(h / group, inner, positions, width);
        dmrt_attention_row_dq(q + head, k + kv_head, v + kv_head, out + head, lse + head / width, dout + head,
                              dq + head, row, positions, width, inner, scale, causal);
    }
}

__global__ static void attention_dkdv_kernel(const float *q, const float *k, const float *v, const float *out,
                                             const float *lse, const float *dout, float *dk, float *dv,
                                             int64_t kv_heads, int64_t group, int64_t inner, int64_t positions,
                                             int64_t width, float scale, int causal) {
    ATTENTION_ROW_LOOP(kv_heads, positions) {
        const int64_t kv = item / positions, row = item % positions;
        const int64_t kv_head = dmrt_attention_head_at(kv, inner, positions, width);
        const int64_t first = dmrt_attention_head_at(kv * group, inner, positions, width); /* its first query head */
        dmrt_attention_row_dkdv_grouped(q + first, k + kv_head, v + kv_head, out + first, lse + first / width,
                                        dout + first, dk + kv_head, dv + kv_head, row, group, positions, width, inner,
                                        scale, causal);
    }
}

/* Both layouts' launches: group > 1 (grouped-query attention) takes inner 1. */
static int attention_forward_launch(dmrt_gpu *g, const float *q, const float *k, const float *v, float *out,
                                    float *lse, int64_t heads, int64_t group, int64_t inner, int64_t positions,
                                    int64_t width, float scale, int causal) {
    GPU_ENTER(g);
    ARG_CHECK(g, dmrt_attention_layout_ok(heads, group, inner, positions, width));
    const int64_t rows = heads * positions;
    if (rows == 0) return DMRT_OK;
    attention_forward_kernel<<<gpu_blocks(rows, 128), 128, 0, g->stream>>>(q, k, v, out, lse, heads, group, inner,
                                                                             positions, width, scale, causal);
    LAUNCH_CHECK(g, "attention_forward_kernel");
    return DMRT_OK;
}

static int attention_backward_launch(dmrt_gpu *g, const float *q, const float *k, const float *v, const float *out,
                                     const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                     int64_t heads, int64_t group, int64_t inner, int64_t positions, int64_t width,
                                     float scale, int causal) {
    GPU_ENTER(g);
    ARG_CHECK(g, dmrt_attention_layout_ok(heads, group, inner, positions, width));
    const int64_t rows = heads * positions, kv_rows = rows / group;
    if (rows == 0) return DMRT_OK;
    attention_dq_kernel<<<gpu_blocks(rows, 128), 128, 0, g->stream>>>(q, k, v, out, lse, dout, dq, heads, group,
                                                                        inner, positions, width, scale, causal);
    LAUNCH_CHECK(g, "attention_dq_kernel");
    attention_dkdv_kernel<<<gpu_blocks(kv_rows, 128), 128, 0, g->stream>>>(q, k, v, out, lse, dout, dk, dv,
                                                                             heads / group, group, inner, positions,
                                                                             width, scale, causal);
    LAUNCH_CHECK(g, "attention_dkdv_kernel");
    return DMRT_OK;
}

int dmrt_gpu_attention_forward_grouped(dmrt_gpu *g, const float *q, const float *k, const float *v, float *out,
                                       float *lse, int64_t heads, int64_t group, int64_t positions, int64_t width,
                                       float scale, int causal) {
    return attention_forward_launch(g, q, k, v, out, lse, heads, group, 1, positions, width, scale, causal);
}

int dmrt_gpu_attention_backward_grouped(dmrt_gpu *g, const float *q, const float *k, const float *v, const float *out,
                                        const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                        int64_t heads, int64_t group, int64_t positions, int64_t width, float scale,
                                        int causal) {
    return attention_backward_launch(g, q, k, v, out, lse, dout, dq, dk, dv, heads, group, 1, positions, width, scale,
                                     causal);
}

int dmrt_gpu_attention_forward_inner(dmrt_gpu *g, const float *q, const float *k, const float *v, float *out,
                                     float *lse, int64_t heads, int64_t inner, int64_t positions, int64_t width,
                                     float scale, int causal) {
    return attention_forward_launch(g, q, k, v, out, lse, heads, 1, inner, positions, width, scale, causal);
}

int dmrt_gpu_attention_backward_inner(dmrt_gpu *g, const float *q, const float *k, const float *v, const float *out,
                                      const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                      int64_t heads, int64_t inner, int64_t positions, int64_t width, float scale,
                                      int causal) {
    return attention_backward_launch(g, q, k, v, out, lse, dout, dq, dk, dv, heads, 1, inner, positions, width, scale,
                                     causal);
}

int dmrt_gpu_attention_forward(dmrt_gpu *g, const float *q, const float *k, const float *v, float *out, float *lse,
                               int64_t heads, int64_t positions, int64_t width, float scale, int causal) {
    return dmrt_gpu_attention_forward_grouped(g, q, k, v, out, lse, heads, 1, positions, width, scale, causal);
}

int dmrt_gpu_attention_backward(dmrt_gpu *g, const float *q, const float *k, const float *v, const float *out,
                                const float *lse, const float *dout, float *dq, float *dk, float *dv, int64_t heads,
                                int64_t positions, int64_t width, float scale, int causal) {
    return dmrt_gpu_attention_backward_grouped(g, q, k, v, out, lse, dout, dq, dk, dv, heads, 1, positions, width,
                                               scale, causal);
}
