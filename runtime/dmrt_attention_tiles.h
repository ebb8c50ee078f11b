/* dmrt_attention_tiles.h: the tile products of fused attention (dmrt_attention.h) with their
 * operands rounded to bf16 first, as --precision bf16 defines every matrix product
 * (docs/precision.md): the products of the rounded values, summed in f32.
 *
 * Two ways, the same values multiplied (only the order of the f32 sums differs):
 *   - where the compiler targets AVX512-BF16 (generated code is compiled with
 *     -march=native): both operands packed as bf16, the right one in pairs of rows
 *     interleaved (the layout vdpbf16ps multiplies), and a register-blocked kernel of
 *     _mm512_dpbf16_ps, twice the f32 FMA's multiply-adds an instruction;
 *   - otherwise: the operands rounded into f32 copies, then dmrt_sgemm, as the f32 kernel
 *     multiplies its tiles (9% slower than it on an AVX-512 EPYC, where the bf16 kernel
 *     takes 28% less time than the f32 one on gpt big's heads).
 * fp16 is not offered: its rounding does not vectorise without F16C's conversions, and the
 * copies made the kernel 2.5x slower than f32's (the C target's fp16 attention stays f32).
 * Operands are packed from the f32 tiles the kernel holds, for each product (a tile is at
 * most 64 x max(64, head width) values, a small part of its product's work), but for a
 * block of keys' three packings, which the backward keeps for all its blocks of queries
 * (dmrt_attention_backward_head_bf16_).
 *
 * Not a public interface: included by attention_kernels.h. */
#ifndef DMRT_ATTENTION_TILES_H
#define DMRT_ATTENTION_TILES_H

#include <stdint.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_attention.h"
#include "dmrt_half.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define DMRT_ATTENTION_BF16_KERNEL 1
#else
#define DMRT_ATTENTION_BF16_KERNEL 0
#endif

static inline float dmrt_attention_bf16_value_(float x) { return dmrt_bf16_to_f32(dmrt_bf16_round(x)); }

/* op(a) (m x k) rounded to bf16 values into an f32 copy, row-major, k apart: a loop per
 * case, each reading a's rows in order (the compiler vectorises the rounding). */
static inline void dmrt_attention_round_left_(int trans, int64_t m, int64_t k, const float *a, int64_t lda, float *out) {
    if (trans)
        for (int64_t t = 0; t < k; t++)
            for (int64_t i = 0; i < m; i++) out[i * k + t] = dmrt_attention_bf16_value_(a[t * lda + i]);
    else
        for (int64_t i = 0; i < m; i++)
            for (int64_t t = 0; t < k; t++) out[i * k + t] = dmrt_attention_bf16_value_(a[i * lda + t]);
}

#if DMRT_ATTENTION_BF16_KERNEL
/* op(a) (m x k) as bf16 rows of k rounded up to even (a zero after an odd k): each row's
 * pairs along k, which the kernel broadcasts. */
static inline void dmrt_attention_pack_left_bf16_(int trans, int64_t m, int64_t k, const float *a, int64_t lda,
                                                  uint16_t *out) {
    const int64_t k_even = (k + 1) / 2 * 2;
    for (int64_t i = 0; i < m; i++) {
        uint16_t *row = out + i * k_even;
        if (trans)
            for (int64_t t = 0; t < k; t++) row[t] = dmrt_bf16_round(a[t * lda + i]);
        else
            for (int64_t t = 0; t < k; t++) row[t] = dmrt_bf16_round(a[i * lda + t]);
        if (k < k_even) row[k] = 0;
    }
}

/* 16 floats rounded to bf16 as dmrt_bf16_round rounds them, each in its 32-bit lane's low half */
static inline __m512i dmrt_attention_round16_(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
}

/* The 16 x 16 32-bit values of rows transposed: columns[c] lane r = rows[r] lane c. */
static inline void dmrt_attention_transpose16_(const __m512i rows[16], __m512i columns[16]) {
    __m512i t[16], u[16], v[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(rows[i], rows[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            v[i + j] = _mm512_shuffle_i32x4(u[i + j], u[i + 4 + j], 0x88);
            v[i + 4 + j] = _mm512_shuffle_i32x4(u[i + j], u[i + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        columns[j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0x88);
        columns[8 + j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0xdd);
    }
}

/* dmrt_attention_pack_right_bf16_ of op(b) = b^T (k x n, b n rows ldb apart): pair p's
 * column j is the bf16 pair of b's row j at 2p and 2p + 1, that row's rounding read as
 * 32-bit words. 16 rows of b at a time, rounded 32 values (16 pairs) at a time, the
 * 16 x 16 words transposed into 16 pairs' rows of 16 columns. */
static inline void dmrt_attention_pack_transposed_bf16_(int64_t k, int64_t n, const float *b, int64_t ldb,
                                                        uint16_t *out) {
    const int64_t cols = dmrt_attention_packed_cols_(n), pairs = (k + 1) / 2;
    const __m512i evens = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                                           24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    __m512i rows[16], columns[16];
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
            const int64_t t0 = 2 * p0, left = k - t0;
            const __mmask16 lo = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            const __mmask16 hi = left >= 32 ? (__mmask16)0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1) : 0;
            for (int r = 0; r < 16; r++) {
                if (j0 + r >= n) {
                    rows[r] = _mm512_setzero_si512();
                    continue;
                }
                const float *row = b + (j0 + r) * ldb + t0;
                const __m512i low = dmrt_attention_round16_(_mm512_maskz_loadu_ps(lo, row));
                const __m512i high = dmrt_attention_round16_(_mm512_maskz_loadu_ps(hi, row + 16));
                rows[r] = _mm512_permutex2var_epi16(low, evens, high);
            }
            dmrt_attention_transpose16_(rows, columns);
            const int64_t count = pairs - p0 < 16 ? pairs - p0 : 16;
            for (int64_t i = 0; i < count; i++) _mm512_storeu_si512(out + (p0 + i) * 2 * cols + 2 * j0, columns[i]);
        }
    }
    /* past the last block of 16 columns, zeros to the packed width */
    const int64_t done = (n + 15) / 16 * 16;
    if (done < cols)
        for (int64_t p = 0; p < pairs; p++) memset(out + p * 2 * cols + 2 * done, 0, (size_t)(cols - done) * 2 * sizeof(uint16_t));
}

/* op(b) (k x n) in vdpbf16ps's layout: for each pair of rows t, t + 1 of op(b), its
 * columns' two values side by side, (k + 1) / 2 pairs of dmrt_attention_packed_cols_(n)
 * columns, zeros past n and past k. op(b) = b^T (the attention's kT and vT) packs by
 * transposing words (above): read one value at a time down b's columns it took three
 * times as long as the other packings (1.2 us for a 64 x 64 tile on the AVX-512 EPYC, 0.4
 * now). */
static inline void dmrt_attention_pack_right_bf16_(int trans, int64_t k, int64_t n, const float *b, int64_t ldb,
                                                   uint16_t *out) {
    if (trans) {
        dmrt_attention_pack_transposed_bf16_(k, n, b, ldb, out);
        return;
    }
    const int64_t cols = dmrt_attention_packed_cols_(n), pairs = (k + 1) / 2;
    for (int64_t p = 0; p < pairs; p++) {
        uint16_t *row = out + p * 2 * cols;
        const int64_t t = 2 * p;
        const int second = t + 1 < k;
        const float *r0 = b + t * ldb, *r1 = b + (t + 1) * ldb;
        for (int64_t j = 0; j < n; j++) {
            row[2 * j] = dmrt_bf16_round(r0[j]);
            row[2 * j + 1] = second ? dmrt_bf16_round(r1[j]) : 0;
        }
        memset(row + 2 * n, 0, (size_t)(cols - n) * 2 * sizeof(uint16_t));
    }
}

/* A packed left operand: row r's pair p at at[r * row_step + p * pair_step] (in bf16
 * values). Packed by dmrt_attention_pack_left_bf16_: row_step k rounded up to even,
 * pair_step 2. Or, for the transpose of a matrix packed as a right operand
 * (dmrt_attention_pack_right_bf16_ of op(b) = that matrix): row_step 2, pair_step twice
 * its packed columns (the pairs are what the transpose's rows need, read in place). */
typedef struct dmrt_attention_left_ {
    const uint16_t *at;
    int64_t row_step, pair_step;
} dmrt_attention_left_;

/* c's rows i0 .. i0 + rows (rows <= 8) and columns j0 .. j0 + cols (cols <= 32): alpha
 * times the sums over the pairs, added to c where accumulate. 16 accumulators of 16
 * floats; each pair loads two vectors of the right operand and broadcasts one pair of
 * each row of the left. */
static inline __attribute__((always_inline)) void dmrt_attention_bf16_block_(
    int rows, int64_t cols, int64_t pairs, float alpha, dmrt_attention_left_ a, const uint16_t *b, int64_t ldb,
    int accumulate, float *c, int64_t ldc) {
    __m512 acc[8][2];
    for (int r = 0; r < 8; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * ldb);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * ldb + 32);
        for (int r = 0; r < rows; r++) {
            int32_t pair;
            memcpy(&pair, a.at + r * a.row_step + p * a.pair_step, sizeof pair);
            const __m512bh left = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], left, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], left, b1);
        }
    }
    const __mmask16 low = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    const __mmask16 high = cols >= 32 ? (__mmask16)0xffff : cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1) : 0;
    const __m512 scale = _mm512_set1_ps(alpha);
    for (int r = 0; r < rows; r++) {
        float *row = c + r * ldc;
        __m512 v0 = _mm512_mul_ps(acc[r][0], scale), v1 = _mm512_mul_ps(acc[r][1], scale);
        if (accumulate) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(low, row));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(high, row + 16));
        }
        _mm512_mask_storeu_ps(row, low, v0);
        _mm512_mask_storeu_ps(row + 16, high, v1);
    }
}

/* c = alpha * a @ b + (accumulate ? c : 0), c m x n, with a and b packed as above. */
static inline void dmrt_attention_bf16_product_(int64_t m, int64_t n, int64_t k, float alpha, dmrt_attention_left_ a,
                                                const uint16_t *b, int accumulate, float *c, int64_t ldc) {
    const int64_t pairs = (k + 1) / 2, ldb = 2 * dmrt_attention_packed_cols_(n);
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const int64_t cols = n - j0 < 32 ? n - j0 : 32;
        for (int64_t i0 = 0; i0 < m; i0 += 8) {
            const dmrt_attention_left_ block = {a.at + i0 * a.row_step, a.row_step, a.pair_step};
            if (i0 + 8 <= m)
                dmrt_attention_bf16_block_(8, cols, pairs, alpha, block, b + 2 * j0, ldb, accumulate, c + i0 * ldc + j0,
                                           ldc);
            else
                dmrt_attention_bf16_block_((int)(m - i0), cols, pairs, alpha, block, b + 2 * j0, ldb, accumulate,
                                           c + i0 * ldc + j0, ldc);
        }
    }
}
#endif

/* dmrt_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) (beta 0 or 1) with a's
 * and b's values rounded to bf16 first where operands is DMRT_ATTENTION_BF16, in `pack`
 * (dmrt_attention_pack_floats_ of the tiles). */
static inline void dmrt_attention_product_(int operands, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                                           const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                                           float *c, int64_t ldc, float *pack) {
    if (operands == DMRT_ATTENTION_F32) {
        dmrt_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#if DMRT_ATTENTION_BF16_KERNEL
    uint16_t *left = (uint16_t *)pack, *right = left + m * ((k + 1) / 2 * 2);
    dmrt_attention_pack_left_bf16_(ta, m, k, a, lda, left);
    dmrt_attention_pack_right_bf16_(tb, k, n, b, ldb, right);
    const dmrt_attention_left_ rows = {left, (k + 1) / 2 * 2, 2};
    dmrt_attention_bf16_product_(m, n, k, alpha, rows, right, beta != 0.0f, c, ldc);
#else
    float *left = pack, *right = pack + m * k;
    dmrt_attention_round_left_(ta, m, k, a, lda, left);
    /* op(b) (k x n) rounded as a left operand is: its rows are op(b)'s */
    dmrt_attention_round_left_(tb, k, n, b, ldb, right);
    dmrt_sgemm(0, 0, m, n, k, alpha, left, k, right, n, beta, c, ldc);
#endif
}

#endif
