/* test_quantize_weight: dmrt_quantize_weight (runtime/gemm_quant.c), the narrow weights of
 * --quantize int8-weights / int4-weights, on the columns whose scale has no finite f32
 * reciprocal (all |w| subnormal, below about 2.9e-39 * qmax): each w quantized as w / scale
 * (not every nonzero w at a bound, nor 0 * inf = NaN made an integer), next to an ordinary
 * column, whose integers are torch.quantize_per_channel's (w times the f32 reciprocal);
 * and a NaN or infinite w, which becomes 0. int8 and int4 (one group). A weight read
 * transposed (q.transposed, the parameter [cols, rows]): the integers and scales of its
 * transpose read plainly, and dmrt_dequantize_param writing them back in its layout; and an
 * embedding's rows gathered from such a weight (dmrt_qweight_gather_rows). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"
#include "dmrt_quant_size.h"

#define ROWS 5

/* column 0 tiny, column 1 ordinary (row 1 a tie: 0.5 / (1 / 127) = 63.5 rounds to even) */
static const float tiny[ROWS] = {1e-39f, 5e-40f, -1e-39f, 2.5e-40f, 0.0f};
static const float ordinary[ROWS] = {1.0f, 0.5f, -1.0f, 0.25f, 0.0f};

static int q_at(const dmrt_qweight *q, int r, int c) {
    if (q->bits == 8) return ((const int8_t *)q->data)[r * q->cols + c];
    int nibble = (q->data[r * ((q->cols + 1) / 2) + c / 2] >> (c & 1 ? 4 : 0)) & 15;
    return nibble >= 8 ? nibble - 16 : nibble;
}

/* quantizes the [ROWS, 3] weight whose columns are tiny, ordinary and col2, and checks them */
static int check_width(int bits, const int *want_tiny, const int *want_ordinary, const float *col2,
                       const int *want_col2) {
    int fails = 0;
    float w[ROWS * 3];
    for (int r = 0; r < ROWS; r++) w[r * 3] = tiny[r], w[r * 3 + 1] = ordinary[r], w[r * 3 + 2] = col2[r];
    dmrt_qweight q;
    if (dmrt_qweight_init(&q, bits, ROWS, 3, ROWS) != 0) {
        fprintf(stderr, "dmrt_qweight_init failed\n");
        return 1;
    }
    dmrt_quantize_weight(&q, w);
    CHECK(q.scale[0] > 0.0f && isinf(1.0f / q.scale[0]), "int%d: the tiny column's scale %g has a finite reciprocal "
          "(the test no longer reaches the case)", bits, (double)q.scale[0]);
    for (int r = 0; r < ROWS; r++) {
        CHECK(q_at(&q, r, 0) == want_tiny[r], "int%d: tiny column row %d: q %d, want %d", bits, r, q_at(&q, r, 0),
              want_tiny[r]);
        CHECK(q_at(&q, r, 1) == want_ordinary[r], "int%d: ordinary column row %d: q %d, want %d", bits, r,
              q_at(&q, r, 1), want_ordinary[r]);
        CHECK(q_at(&q, r, 2) == want_col2[r], "int%d: column 2 row %d (w %g): q %d, want %d", bits, r, (double)col2[r],
              q_at(&q, r, 2), want_col2[r]);
    }
    dmrt_qweight_free(&q);
    return fails;
}

/* The [ROWS, 3] weight above given transposed, [3, ROWS]: the same q and scales as the
 * plain one, and dmrt_dequantize_param's values the plain dequantization's, transposed. */
static int check_transposed(int bits, const float *col2) {
    int fails = 0;
    float w[ROWS * 3], wt[3 * ROWS], back[ROWS * 3], back_t[3 * ROWS];
    for (int r = 0; r < ROWS; r++) {
        w[r * 3] = tiny[r], w[r * 3 + 1] = ordinary[r] * 3.0f, w[r * 3 + 2] = col2[r];
        for (int c = 0; c < 3; c++) wt[c * ROWS + r] = w[r * 3 + c];
    }
    dmrt_qweight plain, transposed;
    if (dmrt_qweight_init(&plain, bits, ROWS, 3, ROWS) != 0 || dmrt_qweight_init(&transposed, bits, ROWS, 3, ROWS) != 0) {
        fprintf(stderr, "dmrt_qweight_init failed\n");
        return 1;
    }
    transposed.transposed = 1;
    dmrt_quantize_weight(&plain, w);
    dmrt_quantize_weight(&transposed, wt);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 3; c++)
            CHECK(q_at(&plain, r, c) == q_at(&transposed, r, c), "int%d transposed: q[%d, %d] %d, the plain one's %d", bits,
                  r, c, q_at(&transposed, r, c), q_at(&plain, r, c));
    for (int c = 0; c < 3; c++)
        CHECK(plain.scale[c] == transposed.scale[c], "int%d transposed: scale %d differs", bits, c);
    dmrt_dequantize_param(&plain, back);
    dmrt_dequantize_param(&transposed, back_t);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < 3; c++)
            CHECK(back_t[c * ROWS + r] == back[r * 3 + c] || (isnan(back_t[c * ROWS + r]) && isnan(back[r * 3 + c])),
                  "int%d transposed: dequantized [%d, %d] %g, the plain one's %g", bits, c, r,
                  (double)back_t[c * ROWS + r], (double)back[r * 3 + c]);
    dmrt_qweight_free(&plain);
    dmrt_qweight_free(&transposed);
    return fails;
}

/* An embedding of a table held narrow (--quantize-embeddings): dmrt_qweight_gather_rows's
 * rows are dmrt_dequantize_param's rows of the table, bit for bit, for a table of V rows
 * and C columns (int8; int4 in groups of 3 of its C, odd V so a byte holds two rows' halves),
 * ids in any order and repeated. */
static int check_gather(int bits) {
    enum { V = 7, C = 8 };
    int fails = 0;
    float table[V * C], whole[V * C], rows[6 * C];
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) table[v * C + c] = (float)((v * 7 + c * 5) % 11) * 0.37f - 1.8f + (float)v * 0.01f;
    dmrt_qweight q;
    if (dmrt_qweight_init(&q, bits, C, V, bits == 4 ? 3 : C) != 0) {
        fprintf(stderr, "dmrt_qweight_init failed\n");
        return 1;
    }
    q.transposed = 1;
    dmrt_quantize_weight(&q, table);
    dmrt_dequantize_param(&q, whole);
    const int32_t ids[6] = {6, 0, 3, 3, 5, 1};
    dmrt_qweight_gather_rows(&q, ids, 6, rows);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < C; c++)
            CHECK(rows[r * C + c] == whole[ids[r] * C + c], "int%d gather: row %d (id %d) [%d] %g, dequantized %g", bits, r,
                  ids[r], c, (double)rows[r * C + c], (double)whole[ids[r] * C + c]);
    dmrt_qweight_free(&q);
    return fails;
}

/* A weight-only product over a weight wider than one widening block (dmrt_quant_size.h:
 * more than 16 MiB in f32, so widened and multiplied a block of columns at a time): C = A W +
 * beta C against the dot products in double of A and dmrt_dequantize_param's W, within the
 * rounding of f32 sums (|A| |W| 2^-20); C's padding untouched. */
static int check_blocked_product(int bits, float beta) {
    enum { M = 3, K = 16, PAD = 5 };
    const int64_t n = DMRT_WIDEN_FLOATS / K + 100, ldc = n + PAD;
    int fails = 0;
    CHECK(dmrt_qweight_widen_cols(K, n) < n, "a [%d, %lld] weight is widened whole", K, (long long)n);
    float *w = malloc((size_t)(K * n) * sizeof *w), *back = malloc((size_t)(K * n) * sizeof *back);
    float *c = malloc((size_t)(M * ldc) * sizeof *c), *c0 = malloc((size_t)(M * ldc) * sizeof *c0);
    float a[M * K];
    dmrt_qweight q;
    if (!w || !back || !c || !c0 || dmrt_qweight_init(&q, bits, K, n, bits == 4 ? 4 : K) != 0) abort();
    for (int64_t i = 0; i < K * n; i++) w[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    for (int i = 0; i < M * K; i++) a[i] = (float)(i % 7 - 3) * 0.5f;
    for (int64_t i = 0; i < M * ldc; i++) c0[i] = c[i] = (float)(i % 5) - 2.0f;
    dmrt_quantize_weight(&q, w);
    dmrt_dequantize_param(&q, back);
    dmrt_gemm_wq_split(2, &q, M, a, K, beta, c, ldc);
    for (int i = 0; i < M && !fails; i++) {
        for (int64_t j = 0; j < n && !fails; j++) {
            double want = beta * (double)c0[i * ldc + j], size = fabs(want);
            for (int p = 0; p < K; p++) {
                want += (double)a[i * K + p] * back[p * n + j];
                size += fabs((double)a[i * K + p] * back[p * n + j]);
            }
            CHECK(fabs(c[i * ldc + j] - want) <= size * 0x1p-20, "int%d blocked product, beta %g: C[%d, %lld] = %.9g, want %.9g",
                  bits, (double)beta, i, (long long)j, (double)c[i * ldc + j], want);
        }
        for (int64_t j = n; j < ldc && !fails; j++)
            CHECK(c[i * ldc + j] == c0[i * ldc + j], "int%d blocked product: C[%d, %lld] past n was written", bits, i,
                  (long long)j);
    }
    dmrt_qweight_free(&q);
    free(w), free(back), free(c), free(c0);
    return fails;
}

int main(void) {
    int fails = 0;
    fails += check_gather(8) + check_gather(4);
    fails += check_blocked_product(8, 0.0f) + check_blocked_product(4, 1.0f);
    /* NaN and inf w: quantized to 0, the others of the column beside them as its scale says
     * (NaN is left out of amax by fmaxf; inf makes the scale inf, so every finite w is 0) */
    const float nan_col[ROWS] = {NAN, 1.0f, -1.0f, 0.5f, 0.0f};
    const float inf_col[ROWS] = {INFINITY, 1.0f, -1.0f, 0.5f, 0.0f};
    {
        const int tiny8[ROWS] = {127, 64, -127, 32, 0}, ordinary8[ROWS] = {127, 64, -127, 32, 0};
        const int nan8[ROWS] = {0, 127, -127, 64, 0}, inf8[ROWS] = {0, 0, 0, 0, 0};
        fails += check_width(8, tiny8, ordinary8, nan_col, nan8);
        fails += check_width(8, tiny8, ordinary8, inf_col, inf8);
    }
    {
        /* int4: scale max|w| / 7, whose f32 reciprocal is 6.9999995: 0.5 of an ordinary column
         * is 3.4999998, so 3 (torch's integer too), but the tiny column's division 5e-40 / scale
         * is 3.50005, so 4 */
        const int tiny4[ROWS] = {7, 4, -7, 2, 0}, ordinary4[ROWS] = {7, 3, -7, 2, 0};
        const int nan4[ROWS] = {0, 7, -7, 3, 0}, inf4[ROWS] = {0, 0, 0, 0, 0};
        fails += check_width(4, tiny4, ordinary4, nan_col, nan4);
        fails += check_width(4, tiny4, ordinary4, inf_col, inf4);
    }
    {
        const float col2[ROWS] = {0.3f, -2.0f, 1.25f, 0.0f, -0.7f};
        fails += check_transposed(8, col2);
        fails += check_transposed(4, col2);
    }
    if (fails) fprintf(stderr, "test_quantize_weight: %d failed\n", fails);
    else printf("test_quantize_weight: ok\n");
    return fails ? 1 : 0;
}
