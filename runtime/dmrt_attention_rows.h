/* dmrt_attention_rows.h: fused attention one row at a time, the CUDA target's kernels
 * (runtime/cuda/attention.cu runs one thread per row) and compiled as C by the test that
 * checks them against the C target's blocked kernels (tests/runtime/test_attention_rows.c).
 * The same operation as runtime/dmrt_attention.h: out = softmax(q @ kT * scale) @ v per
 * head, keys after the query hidden when causal, lse = the log of each row's softmax
 * denominator, and no head's T x T scores held anywhere. Layout as there: q, k, v, out,
 * dout, dq, dk, dv are (heads / inner, positions, inner, width), lse (heads / inner,
 * positions, inner): with inner 1 the heads one after the other, with inner H the rows of
 * H heads side by side (the [B, T, H, D] a fused gpt.dm attention reads, with no
 * transpose around it). The functions take pointers at one head's row 0 and lse
 * (dmrt_attention_head_at) and step inner * width floats from a row to the next, inner
 * from an lse to the next.
 *
 * A row's forward walks the keys it sees with an online softmax (the running maximum m and
 * sum l of exp(score - m), the output rescaled by exp(m_old - m) when m grows). The
 * backward recomputes each probability as exp(score - lse): the query rows' function adds
 * ds @ k into dq, the key rows' function pT @ dout into dv and dsT @ q into dk, with
 * ds = p * (dout . v - delta) * scale and delta = dout . out of the query's row. Each
 * output row is written by one call, so rows run in any order or in parallel.
 *
 * Grouped-query attention (k, v, dk and dv with heads / group heads, query head h reading
 * their head h / group): the forward and dq rows take k and v at the query's kv head; a kv
 * head's dk and dv rows sum over its group (dmrt_attention_row_dkdv_grouped). Grouped
 * heads are one after the other (inner 1), as passes/fuse_attention.c makes them. */
#ifndef DMRT_ATTENTION_ROWS_H
#define DMRT_ATTENTION_ROWS_H

#include <math.h>
#include <stdint.h>

#include "dmrt_host_device.h"

/* Whether heads of (positions, width) fit a layout: group divides the heads, inner too,
 * and at most one of them is above 1 (grouped-query heads are one after the other). */
DMRT_HOST_DEVICE static inline int dmrt_attention_layout_ok(int64_t heads, int64_t group, int64_t inner,
                                                            int64_t positions, int64_t width) {
    return heads >= 0 && group > 0 && heads % group == 0 && inner > 0 && heads % inner == 0 &&
           (group == 1 || inner == 1) && positions >= 0 && width > 0;
}

/* Floats from an operand's start to row 0 of head h; lse's head h starts at this / width
 * (an lse is an operand of width 1). */
DMRT_HOST_DEVICE static inline int64_t dmrt_attention_head_at(int64_t h, int64_t inner, int64_t positions,
                                                              int64_t width) {
    return ((h / inner) * positions * inner + h % inner) * width;
}

/* Where element i of the heads laid one after the other ((heads, positions, width), as
 * cuDNN takes them) is in the operand of that `inner`: the 16-bit casts' index
 * (runtime/cuda/attention16.cu). */
DMRT_HOST_DEVICE static inline int64_t dmrt_attention_inner_index(int64_t i, int64_t inner, int64_t positions,
                                                                  int64_t width) {
    const int64_t head = positions * width, h = i / head, t = i % head / width;
    return dmrt_attention_head_at(h, inner, positions, width) + t * inner * width + i % width;
}

/* the dot product of two rows of width floats */
DMRT_HOST_DEVICE static inline float dmrt_attention_row_dot(const float *a, const float *b, int64_t width) {
    float sum = 0.0f;
    for (int64_t d = 0; d < width; d++) sum += a[d] * b[d];
    return sum;
}

/* Keys query `query` sees: all, or those up to it when causal. */
DMRT_HOST_DEVICE static inline int64_t dmrt_attention_row_keys(int64_t query, int64_t positions, int causal) {
    return causal ? query + 1 : positions;
}

/* Row `query` of one head: out[query, :] and lse[query]. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_forward(const float *q, const float *k, const float *v,
                                                               float *out, float *lse, int64_t query,
                                                               int64_t positions, int64_t width, int64_t inner,
                                                               float scale, int causal) {
    const int64_t stride = inner * width;
    const float *q_row = q + query * stride;
    float *o_row = out + query * stride;
    float row_max = -INFINITY, row_sum = 0.0f;
    for (int64_t d = 0; d < width; d++) o_row[d] = 0.0f;
    const int64_t keys = dmrt_attention_row_keys(query, positions, causal);
    for (int64_t j = 0; j < keys; j++) {
        const float score = dmrt_attention_row_dot(q_row, k + j * stride, width) * scale;
        const float *v_row = v + j * stride;
        if (score > row_max) { /* the new maximum: what was summed so far rescaled to it */
            const float rescale = expf(row_max - score);
            row_sum = row_sum * rescale + 1.0f;
            for (int64_t d = 0; d < width; d++) o_row[d] = o_row[d] * rescale + v_row[d];
            row_max = score;
        } else {
            const float p = expf(score - row_max);
            row_sum += p;
            for (int64_t d = 0; d < width; d++) o_row[d] += p * v_row[d];
        }
    }
    const float inv_sum = 1.0f / row_sum;
    for (int64_t d = 0; d < width; d++) o_row[d] *= inv_sum;
    lse[query * inner] = row_max + logf(row_sum);
}

/* Row `query` of one head's dq. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dq(const float *q, const float *k, const float *v,
                                                          const float *out, const float *lse, const float *dout,
                                                          float *dq, int64_t query, int64_t positions, int64_t width,
                                                          int64_t inner, float scale, int causal) {
    const int64_t stride = inner * width;
    const float *q_row = q + query * stride, *do_row = dout + query * stride;
    float *dq_row = dq + query * stride;
    const float delta = dmrt_attention_row_dot(do_row, out + query * stride, width), row_lse = lse[query * inner];
    for (int64_t d = 0; d < width; d++) dq_row[d] = 0.0f;
    const int64_t keys = dmrt_attention_row_keys(query, positions, causal);
    for (int64_t j = 0; j < keys; j++) {
        const float *k_row = k + j * stride;
        const float p = expf(dmrt_attention_row_dot(q_row, k_row, width) * scale - row_lse);
        const float ds = p * (dmrt_attention_row_dot(do_row, v + j * stride, width) - delta) * scale;
        for (int64_t d = 0; d < width; d++) dq_row[d] += ds * k_row[d];
    }
}

/* Adds query head `q`'s part of row `key` of dk and dv: over the queries that see the key. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dkdv_add(const float *q, const float *k, const float *v,
                                                                const float *out, const float *lse, const float *dout,
                                                                float *dk, float *dv, int64_t key, int64_t positions,
                                                                int64_t width, int64_t inner, float scale, int causal) {
    const int64_t stride = inner * width;
    const float *k_row = k + key * stride, *v_row = v + key * stride;
    float *dk_row = dk + key * stride, *dv_row = dv + key * stride;
    for (int64_t i = causal ? key : 0; i < positions; i++) {
        const float *q_row = q + i * stride, *do_row = dout + i * stride;
        const float p = expf(dmrt_attention_row_dot(q_row, k_row, width) * scale - lse[i * inner]);
        const float delta = dmrt_attention_row_dot(do_row, out + i * stride, width);
        const float ds = p * (dmrt_attention_row_dot(do_row, v_row, width) - delta) * scale;
        for (int64_t d = 0; d < width; d++) {
            dv_row[d] += p * do_row[d];
            dk_row[d] += ds * q_row[d];
        }
    }
}

/* Row `key` of one kv head's dk and dv: the sum over the `group` query heads reading it,
 * which lie one after the other from q, out, dout (a head apart: positions x width) and
 * lse (positions apart), added in head order. group 1: plain multi-head attention, whose
 * heads may lie side by side (inner > 1); group > 1 takes inner 1. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dkdv_grouped(const float *q, const float *k, const float *v,
                                                                    const float *out, const float *lse,
                                                                    const float *dout, float *dk, float *dv,
                                                                    int64_t key, int64_t group, int64_t positions,
                                                                    int64_t width, int64_t inner, float scale,
                                                                    int causal) {
    const int64_t head = positions * width, row = key * inner * width;
    for (int64_t d = 0; d < width; d++) dk[row + d] = 0.0f, dv[row + d] = 0.0f;
    for (int64_t r = 0; r < group; r++)
        dmrt_attention_row_dkdv_add(q + r * head, k, v, out + r * head, lse + r * positions, dout + r * head, dk, dv,
                                    key, positions, width, inner, scale, causal);
}

#endif
