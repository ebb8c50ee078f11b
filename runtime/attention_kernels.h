/* attention_kernels.h: the fused attention's kernels (dmrt_attention.h says what they
 * compute and how the tensors lie), static functions that runtime/attention.c compiles
 * once for each instruction set libdmrt offers. Not a public interface; the runtime's
 * attention test includes it to check the pieces (tile products, packings) on their own.
 *
 * The tile products go through dmrt_sgemm (BLAS) with f32 operands (`operands`
 * DMRT_ATTENTION_F32); with DMRT_ATTENTION_BF16 (--precision bf16) their operands are
 * rounded to bf16 first and, where the build targets AVX512-BF16, multiplied by vdpbf16ps
 * (dmrt_attention_tiles.h).
 *
 * Forward, per head: for each block of `tile` queries, the blocks of keys it can see (with
 * a causal mask: up to the block's last query; later blocks are skipped whole), each
 * block's scores as one product, then per row an online softmax: the running maximum m
 * and sum l of exp(score - m), the output rows rescaled by exp(m_old - m) when the maximum
 * grows, then the block's exp(score - m) @ v added. At the end out = out / l and
 * lse = m + log(l), the log of each row's softmax denominator.
 *
 * Backward, per head and block of keys: for each block of queries that sees it, the
 * scores again, p = exp(score - lse) (the forward's probabilities, to rounding), then
 *   dv += pT @ dout,  dp = dout @ vT,  ds = p * (dp - delta) * scale,
 *   dq += ds @ k,     dk += dsT @ q,
 * with delta = the row sums of dout * out (= the row sums of p * dp). */
#ifndef DMRT_ATTENTION_KERNELS_H
#define DMRT_ATTENTION_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_attention.h"
#include "dmrt_attention_tiles.h"

/* glibc's vector expf (libmvec), as the generated preamble declares it: the rows' loops
 * of exp vectorise. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
float expf(float) __attribute__((simd("notinbranch")));
#endif

/* Keys query `query` sees among the block of `keys` keys starting at key `first`. */
static inline int64_t dmrt_attention_visible_(int64_t query, int64_t first, int64_t keys, int causal) {
    if (!causal) return keys;
    int64_t seen = query - first + 1;
    return seen < 0 ? 0 : seen < keys ? seen : keys;
}

/* Sums are kept in 8 lanes (one float sum cannot be reordered into vectors), added
 * pairwise at the end. */
static inline float dmrt_attention_lanes_total_(const float lanes[8]) {
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

static inline float dmrt_attention_sum_(const float *x, int64_t n) {
    float lanes[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int lane = 0; lane < 8; lane++) lanes[lane] += x[j + lane];
    for (; j < n; j++) lanes[0] += x[j];
    return dmrt_attention_lanes_total_(lanes);
}

static inline float dmrt_attention_max_(const float *x, int64_t n, float start) {
    float lanes[8] = {start, start, start, start, start, start, start, start};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int lane = 0; lane < 8; lane++) lanes[lane] = x[j + lane] > lanes[lane] ? x[j + lane] : lanes[lane];
    for (; j < n; j++) lanes[0] = x[j] > lanes[0] ? x[j] : lanes[0];
    float m = lanes[0];
    for (int lane = 1; lane < 8; lane++) m = lanes[lane] > m ? lanes[lane] : m;
    return m;
}

/* One row of a block in the online softmax: the scores s[0 .. visible) become
 * exp(s - m) with m the row's new maximum, the hidden ones 0; the running sum is
 * rescaled to m and the block's added; returns exp(m_old - m), by which the row's output
 * so far is to be rescaled. */
static inline float dmrt_attention_online_row_(float *s, int64_t visible, int64_t keys, float *row_max, float *row_sum) {
    float m = dmrt_attention_max_(s, visible, *row_max);
    float rescale = expf(*row_max - m); /* 0 for the first block, whose old maximum is -inf */
    for (int64_t j = 0; j < visible; j++) s[j] = expf(s[j] - m);
    for (int64_t j = visible; j < keys; j++) s[j] = 0.0f;
    *row_sum = *row_sum * rescale + dmrt_attention_sum_(s, visible);
    *row_max = m;
    return rescale;
}

/* Where head h starts in q (and every tensor of its shape) and in lse, and how far apart
 * its rows are in each. */
typedef struct dmrt_attention_head_ {
    size_t at, lse_at;
    int64_t ld, lse_ld;
} dmrt_attention_head_;

static inline dmrt_attention_head_ dmrt_attention_head_of_(int64_t h, int64_t inner, int64_t positions, int64_t width) {
    const int64_t first_row = h / inner * positions * inner + h % inner;
    return (dmrt_attention_head_){.at = (size_t)(first_row * width), .lse_at = (size_t)first_row,
                                  .ld = inner * width, .lse_ld = inner};
}

/* Zeroes rows rows of width floats, ld apart. */
static inline void dmrt_attention_zero_rows_(float *x, int64_t rows, int64_t width, int64_t ld) {
    for (int64_t i = 0; i < rows; i++) memset(x + i * ld, 0, (size_t)width * sizeof(float));
}

/* The heads first .. end of the forward, in work. */
static inline void dmrt_attention_forward_heads_(int operands, const float *q, const float *k, const float *v,
                                                 float *out, float *lse, int64_t first, int64_t end, int64_t inner,
                                                 int64_t group, int64_t positions, int64_t width, float scale,
                                                 int causal, float *work) {
    const int64_t T = positions, D = width, tile = dmrt_attention_tile(positions);
    float *scores = work;               /* (tile, tile) a block's scores, then their exp */
    float *row_max = work + tile * tile; /* (tile) each query's running maximum */
    float *row_sum = row_max + tile;     /* (tile) its running sum of exp(score - maximum) */
    float *pack = work + dmrt_attention_work_floats(T); /* a 16-bit tile product's operands */
    for (int64_t h = first; h < end; h++) {
        const dmrt_attention_head_ at = dmrt_attention_head_of_(h, inner, T, D);
        const size_t kv_at = dmrt_attention_head_of_(h / group, inner, T, D).at;
        const int64_t ld = at.ld;
        const float *qh = q + at.at, *kh = k + kv_at, *vh = v + kv_at;
        float *oh = out + at.at, *lh = lse + at.lse_at;
        for (int64_t q0 = 0; q0 < T; q0 += tile) {
            const int64_t nq = T - q0 < tile ? T - q0 : tile;
            float *block_out = oh + q0 * ld;
            dmrt_attention_zero_rows_(block_out, nq, D, ld);
            for (int64_t i = 0; i < nq; i++) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
            /* with a causal mask, the key blocks after the last query's are hidden whole */
            const int64_t key_end = causal ? q0 + nq : T;
            for (int64_t k0 = 0; k0 < key_end; k0 += tile) {
                const int64_t nk = key_end - k0 < tile ? key_end - k0 : tile;
                dmrt_attention_product_(operands, 0, 1, nq, nk, D, scale, qh + q0 * ld, ld, kh + k0 * ld, ld, 0.0f,
                                        scores, tile, pack);
                for (int64_t i = 0; i < nq; i++) {
                    int64_t visible = dmrt_attention_visible_(q0 + i, k0, nk, causal);
                    float rescale = dmrt_attention_online_row_(scores + i * tile, visible, nk, &row_max[i], &row_sum[i]);
                    if (rescale != 1.0f)
                        for (int64_t d = 0; d < D; d++) block_out[i * ld + d] *= rescale;
                }
                dmrt_attention_product_(operands, 0, 0, nq, D, nk, 1.0f, scores, tile, vh + k0 * ld, ld, 1.0f,
                                        block_out, ld, pack);
            }
            for (int64_t i = 0; i < nq; i++) {
                const float inv_sum = 1.0f / row_sum[i];
                for (int64_t d = 0; d < D; d++) block_out[i * ld + d] *= inv_sum;
                lh[(q0 + i) * at.lse_ld] = row_max[i] + logf(row_sum[i]);
            }
        }
    }
}

/* Heads are independent: `threads` threads take blocks of them, each block computed as one
 * thread computes it (the same bits for any count). The first block works in work, the
 * others in room on their threads' stacks (`floats` each). */
#define DMRT_ATTENTION_HEADS_SPLIT_(threads, heads, floats, work, call)                                     \
    do {                                                                                                   \
        const int blocks_ = (threads) < 1 ? 1 : (int64_t)(threads) > (heads) ? (int)(heads) : (threads);  \
        DMRT_PARALLEL_FOR(blocks_)                                                                         \
        for (int block_ = 0; block_ < blocks_; block_++) {                                                 \
            const int64_t first_ = (heads) * block_ / blocks_, end_ = (heads) * (block_ + 1) / blocks_;     \
            if (block_ == 0) {                                                                             \
                float *const block_work_ = (work);                                                         \
                call;                                                                                      \
            } else {                                                                                       \
                float stack_work_[(floats)];                                                               \
                float *const block_work_ = stack_work_;                                                    \
                call;                                                                                      \
            }                                                                                              \
        }                                                                                                  \
    } while (0)

static inline void dmrt_attention_forward_tiled_(const float *q, const float *k, const float *v, float *out, float *lse,
                                          int64_t heads, int64_t inner, int64_t positions, int64_t width, float scale,
                                          int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_HEADS_SPLIT_(threads, heads, dmrt_attention_work_floats_of(operands, positions, width), work,
                                dmrt_attention_forward_heads_(operands, q, k, v, out, lse, first_, end_, inner, 1, positions,
                                                              width, scale, causal, block_work_));
}

/* The forward of grouped-query attention: k and v have heads / group heads (heads one
 * after the other). */
static inline void dmrt_attention_forward_grouped_tiled_(const float *q, const float *k, const float *v, float *out,
                                                  float *lse, int64_t heads, int64_t group, int64_t positions,
                                                  int64_t width, float scale, int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_HEADS_SPLIT_(threads, heads, dmrt_attention_work_floats_of(operands, positions, width), work,
                                dmrt_attention_forward_heads_(operands, q, k, v, out, lse, first_, end_, 1, group, positions,
                                                              width, scale, causal, block_work_));
}

/* delta[i] = the sum over d of dout[i, d] * out[i, d], for the rows of a head (ld apart).
 * With bf16 operands dout is read rounded, as the product dp = dout @ vT reads it: delta is
 * the row sum of p * dp, which then holds to f32 rounding (a single key's ds is 0 again). */
#define DMRT_ATTENTION_DELTA_(read)                                                                \
    for (int64_t i = 0; i < rows; i++) {                                                           \
        const float *a = dout + i * ld, *b = out + i * ld;                                         \
        float lanes[8] = {0};                                                                      \
        int64_t d = 0;                                                                             \
        for (; d + 8 <= width; d += 8)                                                             \
            for (int lane = 0; lane < 8; lane++) lanes[lane] += (read)(a[d + lane]) * b[d + lane]; \
        for (; d < width; d++) lanes[0] += (read)(a[d]) * b[d];                                    \
        delta[i] = dmrt_attention_lanes_total_(lanes);                                             \
    }

static inline float dmrt_attention_as_is_(float x) { return x; }

static inline void dmrt_attention_delta_(int operands, const float *dout, const float *out, int64_t rows, int64_t width,
                                         int64_t ld, float *delta) {
    if (operands == DMRT_ATTENTION_BF16) DMRT_ATTENTION_DELTA_(dmrt_attention_bf16_value_)
    else DMRT_ATTENTION_DELTA_(dmrt_attention_as_is_)
}

/* A block's scores (nq x nk, tile apart) become the forward's probabilities exp(score -
 * lse), the hidden ones 0. */
static inline void dmrt_attention_probs_(float *probs, int64_t tile, int64_t nq, int64_t nk, int64_t q0, int64_t k0,
                                         const float *lse, int64_t lse_ld, int causal) {
    for (int64_t i = 0; i < nq; i++) {
        float *p = probs + i * tile;
        const float row_lse = lse[(q0 + i) * lse_ld];
        int64_t visible = dmrt_attention_visible_(q0 + i, k0, nk, causal);
        for (int64_t j = 0; j < visible; j++) p[j] = expf(p[j] - row_lse);
        for (int64_t j = visible; j < nk; j++) p[j] = 0.0f;
    }
}

/* A block's dp (nq x nk, tile apart) becomes the scores' gradient p * (dp - delta) * scale. */
static inline void dmrt_attention_dscores_(float *dscores, const float *probs, int64_t tile, int64_t nq, int64_t nk,
                                           const float *delta, float scale) {
    for (int64_t i = 0; i < nq; i++) {
        const float *p = probs + i * tile;
        float *ds = dscores + i * tile;
        const float row_delta = delta[i];
        for (int64_t j = 0; j < nk; j++) ds[j] = p[j] * (ds[j] - row_delta) * scale;
    }
}

#if DMRT_ATTENTION_BF16_KERNEL
/* dmrt_attention_backward_head_ with bf16 operands on AVX512-BF16: the same products of
 * the same rounded values, each operand packed once where several products read it (a
 * block of keys' k and v, three ways, for all its blocks of queries), and the two
 * products of a transpose (pT @ dout, dsT @ q) reading the pairs of its packing as a right
 * operand in place (dmrt_attention_left_) instead of packing the transpose. */
static inline void dmrt_attention_backward_head_bf16_(const float *qh, const float *kh, const float *vh,
                                                      const float *doh, const float *lh, int64_t lse_ld,
                                                      const float *delta, float *dqh, float *dkh, float *dvh,
                                                      int64_t ld, int64_t T, int64_t D, float scale, int causal,
                                                      float *probs, float *dscores, float *pack) {
    const int64_t tile = dmrt_attention_tile(T), room = dmrt_attention_pack_room_(tile, D);
    uint16_t *k_right_t = (uint16_t *)pack, *v_right_t = k_right_t + room, *k_right = v_right_t + room;
    uint16_t *left = k_right + room, *right = left + room;
    const int64_t d_even = (D + 1) / 2 * 2;
    for (int64_t k0 = 0; k0 < T; k0 += tile) {
        const int64_t nk = T - k0 < tile ? T - k0 : tile;
        dmrt_attention_pack_right_bf16_(1, D, nk, kh + k0 * ld, ld, k_right_t); /* kT, for the scores */
        dmrt_attention_pack_right_bf16_(1, D, nk, vh + k0 * ld, ld, v_right_t); /* vT, for dp */
        dmrt_attention_pack_right_bf16_(0, nk, D, kh + k0 * ld, ld, k_right);   /* k, for dq */
        for (int64_t q0 = causal ? k0 : 0; q0 < T; q0 += tile) {
            const int64_t nq = T - q0 < tile ? T - q0 : tile;
            const dmrt_attention_left_ rows_d = {left, d_even, 2}, rows_k = {left, (nk + 1) / 2 * 2, 2};
            dmrt_attention_pack_left_bf16_(0, nq, D, qh + q0 * ld, ld, left);
            dmrt_attention_bf16_product_(nq, nk, D, scale, rows_d, k_right_t, 0, probs, tile);
            dmrt_attention_probs_(probs, tile, nq, nk, q0, k0, lh, lse_ld, causal);
            /* dv += pT @ dout: pT's rows are p's columns, its pairs p packed as a right operand */
            const dmrt_attention_left_ columns = {left, 2, 2 * dmrt_attention_packed_cols_(nk)};
            dmrt_attention_pack_right_bf16_(0, nq, nk, probs, tile, left);
            dmrt_attention_pack_right_bf16_(0, nq, D, doh + q0 * ld, ld, right);
            dmrt_attention_bf16_product_(nk, D, nq, 1.0f, columns, right, 1, dvh + k0 * ld, ld);
            dmrt_attention_pack_left_bf16_(0, nq, D, doh + q0 * ld, ld, left);
            dmrt_attention_bf16_product_(nq, nk, D, 1.0f, rows_d, v_right_t, 0, dscores, tile);
            dmrt_attention_dscores_(dscores, probs, tile, nq, nk, delta + q0, scale);
            dmrt_attention_pack_left_bf16_(0, nq, nk, dscores, tile, left);
            dmrt_attention_bf16_product_(nq, D, nk, 1.0f, rows_k, k_right, 1, dqh + q0 * ld, ld);
            dmrt_attention_pack_right_bf16_(0, nq, nk, dscores, tile, left);
            dmrt_attention_pack_right_bf16_(0, nq, D, qh + q0 * ld, ld, right);
            dmrt_attention_bf16_product_(nk, D, nq, 1.0f, columns, right, 1, dkh + k0 * ld, ld);
        }
    }
}
#endif

/* Query head h of the backward, in work: its dq written, its contributions added to dk
 * and dv at kv_at (zeroed by the caller). */
static inline void dmrt_attention_backward_head_(int operands, const float *q, const float *k, const float *v,
                                                 const float *out, const float *lse, const float *dout, float *dq,
                                                 float *dk, float *dv, int64_t h, size_t kv_at, int64_t inner,
                                                 int64_t positions, int64_t width, float scale, int causal,
                                                 float *work) {
    const int64_t T = positions, D = width, tile = dmrt_attention_tile(positions);
    float *probs = work;                  /* (tile, tile) a block's probabilities */
    float *dscores = work + tile * tile;  /* (tile, tile) their gradient, then the scores' */
    float *delta = dscores + tile * tile; /* (T) each query's sum of dout * out */
    float *pack = work + dmrt_attention_work_floats(T); /* a 16-bit tile product's operands */
    const dmrt_attention_head_ at = dmrt_attention_head_of_(h, inner, T, D);
    const int64_t ld = at.ld;
    const size_t head = at.at;
    const float *qh = q + head, *kh = k + kv_at, *vh = v + kv_at, *doh = dout + head, *lh = lse + at.lse_at;
    float *dqh = dq + head, *dkh = dk + kv_at, *dvh = dv + kv_at;
    dmrt_attention_zero_rows_(dqh, T, D, ld);
    dmrt_attention_delta_(operands, doh, out + head, T, D, ld, delta);
#if DMRT_ATTENTION_BF16_KERNEL
    if (operands == DMRT_ATTENTION_BF16) {
        dmrt_attention_backward_head_bf16_(qh, kh, vh, doh, lh, at.lse_ld, delta, dqh, dkh, dvh, ld, T, D, scale, causal,
                                           probs, dscores, pack);
        return;
    }
#endif
    for (int64_t k0 = 0; k0 < T; k0 += tile) {
        const int64_t nk = T - k0 < tile ? T - k0 : tile;
        /* with a causal mask, the query blocks before this key block see none of it */
        for (int64_t q0 = causal ? k0 : 0; q0 < T; q0 += tile) {
            const int64_t nq = T - q0 < tile ? T - q0 : tile;
            dmrt_attention_product_(operands, 0, 1, nq, nk, D, scale, qh + q0 * ld, ld, kh + k0 * ld, ld, 0.0f, probs,
                                    tile, pack);
            dmrt_attention_probs_(probs, tile, nq, nk, q0, k0, lh, at.lse_ld, causal);
            dmrt_attention_product_(operands, 1, 0, nk, D, nq, 1.0f, probs, tile, doh + q0 * ld, ld, 1.0f,
                                    dvh + k0 * ld, ld, pack);
            dmrt_attention_product_(operands, 0, 1, nq, nk, D, 1.0f, doh + q0 * ld, ld, vh + k0 * ld, ld, 0.0f,
                                    dscores, tile, pack);
            dmrt_attention_dscores_(dscores, probs, tile, nq, nk, delta + q0, scale);
            dmrt_attention_product_(operands, 0, 0, nq, D, nk, 1.0f, dscores, tile, kh + k0 * ld, ld, 1.0f,
                                    dqh + q0 * ld, ld, pack);
            dmrt_attention_product_(operands, 1, 0, nk, D, nq, 1.0f, dscores, tile, qh + q0 * ld, ld, 1.0f,
                                    dkh + k0 * ld, ld, pack);
        }
    }
}

/* The kv heads first .. end of the backward (each the group of query heads reading it),
 * in work. */
static inline void dmrt_attention_backward_heads_(int operands, const float *q, const float *k, const float *v,
                                                  const float *out, const float *lse, const float *dout, float *dq,
                                                  float *dk, float *dv, int64_t first, int64_t end, int64_t inner,
                                                  int64_t group, int64_t positions, int64_t width, float scale,
                                                  int causal, float *work) {
    for (int64_t kv = first; kv < end; kv++) {
        const dmrt_attention_head_ at = dmrt_attention_head_of_(kv, inner, positions, width);
        dmrt_attention_zero_rows_(dk + at.at, positions, width, at.ld);
        dmrt_attention_zero_rows_(dv + at.at, positions, width, at.ld);
        for (int64_t h = kv * group; h < (kv + 1) * group; h++)
            dmrt_attention_backward_head_(operands, q, k, v, out, lse, dout, dq, dk, dv, h, at.at, inner, positions, width, scale,
                                          causal, work);
    }
}

static inline void dmrt_attention_backward_tiled_(const float *q, const float *k, const float *v, const float *out,
                                           const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                           int64_t heads, int64_t inner, int64_t positions, int64_t width,
                                           float scale, int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_HEADS_SPLIT_(threads, heads, dmrt_attention_work_floats_of(operands, positions, width), work,
                                dmrt_attention_backward_heads_(operands, q, k, v, out, lse, dout, dq, dk, dv, first_, end_,
                                                               inner, 1, positions, width, scale, causal, block_work_));
}

/* The backward of grouped-query attention: k, v, dk and dv have heads / group heads
 * (heads one after the other); threads take whole groups. */
static inline void dmrt_attention_backward_grouped_tiled_(const float *q, const float *k, const float *v, const float *out,
                                                   const float *lse, const float *dout, float *dq, float *dk,
                                                   float *dv, int64_t heads, int64_t group, int64_t positions,
                                                   int64_t width, float scale, int causal, int operands, int threads, float *work) {
    DMRT_ATTENTION_HEADS_SPLIT_(threads, heads / group, dmrt_attention_work_floats_of(operands, positions, width), work,
                                dmrt_attention_backward_heads_(operands, q, k, v, out, lse, dout, dq, dk, dv, first_, end_, 1,
                                                               group, positions, width, scale, causal, block_work_));
}

#endif
