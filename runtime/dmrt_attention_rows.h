/* dmrt_attention_rows.h: fused attention one row at a time, the CUDA target's kernels
 * (runtime/cuda/attention.cu runs one thread per row) and compiled as C by the test that
 * checks them against the C target's blocked kernels (tests/runtime/test_attention_rows.c).
 * The same operation as runtime/dmrt_attention.h: out = softmax(q @ kT * scale) @ v per
 * head, keys after the query hidden when causal, lse = the log of each row's softmax
 * denominator, and no head's T x T scores held anywhere. Layout as there: q, k, v, out,
 * dout, dq, dk, dv are (heads, positions, width), lse (heads, positions); `head` below
 * points a function at one head's (positions, width) matrices.
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
 * head's dk and dv rows sum over its group (dmrt_attention_row_dkdv_grouped). */
#ifndef DMRT_ATTENTION_ROWS_H
#define DMRT_ATTENTION_ROWS_H

#include <math.h>
#include <stdint.h>

#include "dmrt_host_device.h"

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
                                                               int64_t positions, int64_t width, float scale,
                                                               int causal) {
    const float *q_row = q + query * width;
    float *o_row = out + query * width;
    float row_max = -INFINITY, row_sum = 0.0f;
    for (int64_t d = 0; d < width; d++) o_row[d] = 0.0f;
    const int64_t keys = dmrt_attention_row_keys(query, positions, causal);
    for (int64_t j = 0; j < keys; j++) {
        const float score = dmrt_attention_row_dot(q_row, k + j * width, width) * scale;
        const float *v_row = v + j * width;
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
    lse[query] = row_max + logf(row_sum);
}

/* Row `query` of one head's dq. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dq(const float *q, const float *k, const float *v,
                                                          const float *out, const float *lse, const float *dout,
                                                          float *dq, int64_t query, int64_t positions, int64_t width,
                                                          float scale, int causal) {
    const float *q_row = q + query * width, *do_row = dout + query * width;
    float *dq_row = dq + query * width;
    const float delta = dmrt_attention_row_dot(do_row, out + query * width, width), row_lse = lse[query];
    for (int64_t d = 0; d < width; d++) dq_row[d] = 0.0f;
    const int64_t keys = dmrt_attention_row_keys(query, positions, causal);
    for (int64_t j = 0; j < keys; j++) {
        const float *k_row = k + j * width;
        const float p = expf(dmrt_attention_row_dot(q_row, k_row, width) * scale - row_lse);
        const float ds = p * (dmrt_attention_row_dot(do_row, v + j * width, width) - delta) * scale;
        for (int64_t d = 0; d < width; d++) dq_row[d] += ds * k_row[d];
    }
}

/* Adds query head `q`'s part of row `key` of dk and dv: over the queries that see the key. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dkdv_add(const float *q, const float *k, const float *v,
                                                                const float *out, const float *lse, const float *dout,
                                                                float *dk, float *dv, int64_t key, int64_t positions,
                                                                int64_t width, float scale, int causal) {
    const float *k_row = k + key * width, *v_row = v + key * width;
    float *dk_row = dk + key * width, *dv_row = dv + key * width;
    for (int64_t i = causal ? key : 0; i < positions; i++) {
        const float *q_row = q + i * width, *do_row = dout + i * width;
        const float p = expf(dmrt_attention_row_dot(q_row, k_row, width) * scale - lse[i]);
        const float delta = dmrt_attention_row_dot(do_row, out + i * width, width);
        const float ds = p * (dmrt_attention_row_dot(do_row, v_row, width) - delta) * scale;
        for (int64_t d = 0; d < width; d++) {
            dv_row[d] += p * do_row[d];
            dk_row[d] += ds * q_row[d];
        }
    }
}

/* Row `key` of one kv head's dk and dv: the sum over the `group` query heads reading it,
 * which lie one after the other from q, out, dout (a head apart: positions x width) and
 * lse (positions apart), added in head order. group 1: plain multi-head attention. */
DMRT_HOST_DEVICE static inline void dmrt_attention_row_dkdv_grouped(const float *q, const float *k, const float *v,
                                                                    const float *out, const float *lse,
                                                                    const float *dout, float *dk, float *dv,
                                                                    int64_t key, int64_t group, int64_t positions,
                                                                    int64_t width, float scale, int causal) {
    const int64_t head = positions * width;
    for (int64_t d = 0; d < width; d++) dk[key * width + d] = 0.0f, dv[key * width + d] = 0.0f;
    for (int64_t r = 0; r < group; r++)
        dmrt_attention_row_dkdv_add(q + r * head, k, v, out + r * head, lse + r * positions, dout + r * head, dk, dv,
                                    key, positions, width, scale, causal);
}

#endif
