/* test_attention: runtime/dmrt_attention.h's fused kernels (the C target's) and
 * runtime/dmrt_attention_rows.h's row functions (the CUDA target's kernels, compiled here
 * as C) against attention written out
 * in double (the scores, the masked softmax, its product with v, and their gradients by
 * the chain rule), at sizes around the 64-position tile (1, 5, 63, 64, 65, 130), head
 * sizes 1, 3 and 16, one and three heads, causal and over every key, with scores large
 * enough that the online softmax's maximum moves between blocks. Bounds: out, lse, dq,
 * dk, dv within 2e-5 + 2e-4 |x| of the double reference (float32 tile products of at
 * most 130 terms; the measured errors are printed). The tiled kernels with the heads side
 * by side in each row (inner > 1, the layout a fused gpt.dm attention reads and writes)
 * must give the bits of the heads one after the other. Grouped-query attention (the
 * _grouped kernels, k and v with heads / group heads) against the plain kernels on k and v
 * repeated group times, as repeat_kv copies them: out, lse and dq bit for bit, dk and dv
 * the sums over each group of the repeated heads' within the bound above (taken in
 * double), the same bits on one thread and on three; and the row functions' grouped form
 * (runtime/cuda/attention.cu's indexing) likewise against the row functions on k and v
 * repeated. The row functions with the heads side by side (the CUDA target's _inner
 * kernels) give the bits of the heads apart, and the 16-bit casts' index function
 * (dmrt_attention_inner_index) the relayout written out here. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"
#include "internal.h"
#include "attention_kernels.h"
#include "dmrt_attention_rows.h"

/* The kernels under test: each set libdmrt holds (dmrt_attention.h) that this CPU can run,
 * one after the other (main). Every AVX2 CPU has F16C, which clang cannot ask about. */
typedef struct kernel_set {
    const char *name;
    int runs; /* the CPU has its instructions */
    void (*forward)(const float *, const float *, const float *, float *, float *, int64_t, int64_t, int64_t, int64_t,
                    float, int, int, int, float *);
    void (*forward_grouped)(const float *, const float *, const float *, float *, float *, int64_t, int64_t, int64_t,
                            int64_t, float, int, int, int, float *);
    void (*backward)(const float *, const float *, const float *, const float *, const float *, const float *, float *,
                     float *, float *, int64_t, int64_t, int64_t, int64_t, float, int, int, int, float *);
    void (*backward_grouped)(const float *, const float *, const float *, const float *, const float *, const float *,
                             float *, float *, float *, int64_t, int64_t, int64_t, int64_t, float, int, int, int, float *);
} kernel_set;

#define KERNEL_SET(isa, cpu_runs)                                                                                   \
    {#isa, cpu_runs, dmrt_attention_forward_##isa, dmrt_attention_forward_grouped_##isa, dmrt_attention_backward_##isa, \
     dmrt_attention_backward_grouped_##isa}
#define CPU_AVX2 (DMRT_CPU_SUPPORTS("avx2") && DMRT_CPU_SUPPORTS("fma"))
#define CPU_AVX512                                                                                                  \
    (CPU_AVX2 && DMRT_CPU_SUPPORTS("avx512f") && DMRT_CPU_SUPPORTS("avx512bw") && DMRT_CPU_SUPPORTS("avx512dq") && \
     DMRT_CPU_SUPPORTS("avx512vl"))

static kernel_set kernels;

typedef struct sizes {
    int heads, positions, width, causal;
} sizes;

static const char *operands_name(int operands) { return operands == DMRT_ATTENTION_BF16 ? "bf16" : "f32"; }

/* out, lse and (with dout) dq, dk, dv of every head, in double. */
static void reference(const sizes *z, const float *q, const float *k, const float *v, const float *dout, double scale,
                      double *out, double *lse, double *dq, double *dk, double *dv) {
    const int T = z->positions, D = z->width;
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    for (int h = 0; h < z->heads; h++) {
        const size_t at = (size_t)h * T * D;
        for (int i = 0; i < T; i++) {
            const int keys = z->causal ? i + 1 : T;
            double max = -INFINITY, sum = 0.0;
            for (int j = 0; j < keys; j++) {
                double s = 0.0;
                for (int d = 0; d < D; d++) s += (double)q[at + (size_t)i * D + d] * k[at + (size_t)j * D + d];
                p[j] = s * scale;
                max = p[j] > max ? p[j] : max;
            }
            for (int j = 0; j < keys; j++) sum += exp(p[j] - max);
            lse[(size_t)h * T + i] = max + log(sum);
            for (int j = 0; j < keys; j++) p[j] = exp(p[j] - max) / sum;
            double delta = 0.0;
            for (int d = 0; d < D; d++) {
                double o = 0.0;
                for (int j = 0; j < keys; j++) o += p[j] * v[at + (size_t)j * D + d];
                out[at + (size_t)i * D + d] = o;
                delta += o * dout[at + (size_t)i * D + d];
            }
            /* dp = dout . v_j; ds = p (dp - delta) scale; dq += ds k_j, dk_j += ds q, dv_j += p dout */
            for (int j = 0; j < keys; j++) {
                dp[j] = 0.0;
                for (int d = 0; d < D; d++) dp[j] += (double)dout[at + (size_t)i * D + d] * v[at + (size_t)j * D + d];
                const double ds = p[j] * (dp[j] - delta) * scale;
                for (int d = 0; d < D; d++) {
                    dq[at + (size_t)i * D + d] += ds * k[at + (size_t)j * D + d];
                    dk[at + (size_t)j * D + d] += ds * q[at + (size_t)i * D + d];
                    dv[at + (size_t)j * D + d] += p[j] * dout[at + (size_t)i * D + d];
                }
            }
        }
    }
    free(p);
    free(dp);
}

/* The largest |got - want| / (2e-5 + 2e-4 |want|) over n values. */
static double worst(const float *got, const double *want, size_t n, double *abs_err) {
    double ratio = 0.0;
    *abs_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]), r = e / (2e-5 + 2e-4 * fabs(want[i]));
        if (e > *abs_err) *abs_err = e;
        if (!(r <= ratio)) ratio = r; /* NaN counts as a failure */
    }
    return ratio;
}

/* The row functions over every row of every head, as runtime/cuda/attention.cu's threads run
 * and index them (dmrt_attention_head_at): k, v, dk and dv with heads / group heads, query
 * head h reading kv head h / group, a kv head's dk and dv rows summed over its group's
 * query heads (group 1: plain multi-head attention, by_rows); inner heads side by side in a
 * row (group 1). */
static void by_rows_layout(const sizes *z, int group, int inner, const float *q, const float *k, const float *v,
                           const float *dout, float scale, float *out, float *lse, float *dq, float *dk, float *dv) {
    const int64_t T = z->positions, D = z->width;
    for (int64_t h = 0; h < z->heads; h++) {
        const int64_t at = dmrt_attention_head_at(h, inner, T, D), kv_at = dmrt_attention_head_at(h / group, inner, T, D);
        for (int64_t row = 0; row < T; row++)
            dmrt_attention_row_forward(q + at, k + kv_at, v + kv_at, out + at, lse + at / D, row, T, D, inner, scale,
                                       z->causal);
        for (int64_t row = 0; row < T; row++)
            dmrt_attention_row_dq(q + at, k + kv_at, v + kv_at, out + at, lse + at / D, dout + at, dq + at, row, T, D,
                                  inner, scale, z->causal);
    }
    for (int64_t kv = 0; kv < z->heads / group; kv++) {
        const int64_t first = dmrt_attention_head_at(kv * group, inner, T, D), kv_at = dmrt_attention_head_at(kv, inner, T, D);
        for (int64_t row = 0; row < T; row++)
            dmrt_attention_row_dkdv_grouped(q + first, k + kv_at, v + kv_at, out + first, lse + first / D, dout + first,
                                            dk + kv_at, dv + kv_at, row, group, T, D, inner, scale, z->causal);
    }
}

static void by_rows_grouped(const sizes *z, int group, const float *q, const float *k, const float *v,
                            const float *dout, float scale, float *out, float *lse, float *dq, float *dk, float *dv) {
    by_rows_layout(z, group, 1, q, k, v, dout, scale, out, lse, dq, dk, dv);
}

static void by_rows(const sizes *z, const float *q, const float *k, const float *v, const float *dout, float scale,
                    float *out, float *lse, float *dq, float *dk, float *dv) {
    by_rows_grouped(z, 1, q, k, v, dout, scale, out, lse, dq, dk, dv);
}

/* The row functions' grouped form (the CUDA target's kernels) against by_rows on k and v
 * repeated: out, lse and dq bit for bit, dk and dv the repeated heads' sums within the bound. */
static int rows_grouped_as_repeated(const sizes *z, int group, const float *in, const float *kv, const float *repeated,
                                    float scale) {
    int fails = 0;
    const int T = z->positions, D = z->width;
    const size_t head = (size_t)T * D, n = (size_t)z->heads * head, rows = (size_t)z->heads * T;
    const size_t kv_n = n / (size_t)group;
    float *plain = malloc(sizeof(float) * (4 * n + rows)), *grouped = malloc(sizeof(float) * (2 * n + rows + 2 * kv_n));
    double *sums = malloc(sizeof(double) * 2 * kv_n);
    const float *q = in, *dout = in + 3 * n;
    by_rows(z, q, repeated, repeated + n, dout, scale, plain, plain + n, plain + n + rows, plain + 2 * n + rows,
            plain + 3 * n + rows);
    float *g_dk = grouped + 2 * n + rows;
    by_rows_grouped(z, group, q, kv, kv + kv_n, dout, scale, grouped, grouped + n, grouped + n + rows, g_dk,
                    g_dk + kv_n);
    CHECK(memcmp(grouped, plain, sizeof(float) * (2 * n + rows)) == 0,
          "rows: heads %d in groups of %d T %d D %d causal %d: out, lse or dq not the repeated heads' bits", z->heads,
          group, T, D, z->causal);
    for (size_t part = 0; part < 2; part++)
        for (size_t g = 0; g < kv_n / head; g++)
            for (size_t e = 0; e < head; e++) {
                double sum = 0.0;
                for (int r = 0; r < group; r++)
                    sum += plain[2 * n + rows + part * n + (g * (size_t)group + (size_t)r) * head + e];
                sums[part * kv_n + g * head + e] = sum;
            }
    double abs_err, ratio = worst(g_dk, sums, 2 * kv_n, &abs_err);
    printf("rows   heads %d in groups of %d T %3d D %2d %-7s dk, dv max abs error %.3g (error/bound %.3g)\n", z->heads,
           group, T, D, z->causal ? "causal" : "every", abs_err, ratio);
    CHECK(ratio <= 1.0, "rows: heads %d in groups of %d T %d D %d causal %d: dk, dv off the repeated heads' sums by %g",
          z->heads, group, T, D, z->causal, abs_err);
    free(plain);
    free(grouped);
    free(sums);
    return fails;
}

/* x, (heads, T, D) with heads = outer * inner, as (outer, T, inner, D) (to_inner) or back. */
static void relayout(const float *x, float *y, int outer, int inner, int T, int D, int to_inner) {
    for (int o = 0; o < outer; o++)
        for (int h = 0; h < inner; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < D; d++) {
                    size_t heads_apart = (((size_t)o * inner + h) * T + t) * D + d;
                    size_t side_by_side = (((size_t)o * T + t) * inner + h) * D + d;
                    if (to_inner) y[side_by_side] = x[heads_apart];
                    else y[heads_apart] = x[side_by_side];
                }
}

/* The same attention with the heads side by side in each row ([B, T, H, D], inner = H: the
 * layout gpt.dm's reshapes leave, passes/fuse_attention.c): every result, relaid out, bit
 * for bit the one of the heads one after the other (got: out, lse, dq, dk, dv), on one
 * thread and on three; the row functions so indexed bit for bit theirs (rows_got), and
 * dmrt_attention_inner_index the relayout's. Splits the heads as outer x inner every way
 * it can. */
static int heads_inner_same_bits(const sizes *z, const float *in, const float *got, const float *rows_got, float scale,
                                 int operands, float *work) {
    int fails = 0;
    const int T = z->positions, D = z->width;
    const size_t n = (size_t)z->heads * T * D, rows = (size_t)z->heads * T;
    float *side = malloc(sizeof(float) * 4 * n), *res = malloc(sizeof(float) * (4 * n + rows));
    float *back = malloc(sizeof(float) * (4 * n + rows));
    for (int inner = 1; inner <= z->heads; inner++) {
        if (z->heads % inner) continue;
        const int outer = z->heads / inner;
        for (int t = 0; t < 4; t++) relayout(in + t * n, side + t * n, outer, inner, T, D, 1);
        for (int threads = 1; threads <= 3; threads += 2) {
            float *out = res, *lse = res + n, *dq = res + n + rows;
            kernels.forward(side, side + n, side + 2 * n, out, lse, z->heads, inner, T, D, scale, z->causal,
                                   operands, threads, work);
            kernels.backward(side, side + n, side + 2 * n, out, lse, side + 3 * n, dq, dq + n, dq + 2 * n,
                                    z->heads, inner, T, D, scale, z->causal, operands, threads, work);
            relayout(out, back, outer, inner, T, D, 0);
            relayout(lse, back + n, outer, inner, T, 1, 0);
            for (int part = 0; part < 3; part++) relayout(dq + part * n, back + n + rows + part * n, outer, inner, T, D, 0);
            CHECK(memcmp(back, got, sizeof(float) * (4 * n + rows)) == 0,
                  "heads %d (%d x %d side by side) T %d D %d causal %d, %s, %d thread(s): not the bits of the heads apart",
                  z->heads, outer, inner, T, D, z->causal, operands_name(operands), threads);
        }
        if (!rows_got) continue; /* the row functions are f32's */
        /* the row functions (the CUDA target's _inner kernels) likewise against by_rows */
        float *out = res, *lse = res + n, *dq = res + n + rows;
        by_rows_layout(z, 1, inner, side, side + n, side + 2 * n, side + 3 * n, scale, out, lse, dq, dq + n,
                       dq + 2 * n);
        relayout(out, back, outer, inner, T, D, 0);
        relayout(lse, back + n, outer, inner, T, 1, 0);
        for (int part = 0; part < 3; part++) relayout(dq + part * n, back + n + rows + part * n, outer, inner, T, D, 0);
        CHECK(memcmp(back, rows_got, sizeof(float) * (4 * n + rows)) == 0,
              "rows: heads %d (%d x %d side by side) T %d D %d causal %d: not the bits of the heads apart", z->heads,
              outer, inner, T, D, z->causal);
        /* the 16-bit casts' index (attention16.cu): element i of the heads apart is there */
        int64_t misplaced = 0;
        for (size_t i = 0; i < n; i++)
            misplaced += side[dmrt_attention_inner_index((int64_t)i, inner, T, D)] != in[i];
        for (size_t i = 0; i < rows; i++) /* lse, an operand of width 1 */
            misplaced += lse[dmrt_attention_inner_index((int64_t)i, inner, T, 1)] != back[n + i];
        CHECK(misplaced == 0, "heads %d (%d x %d side by side) T %d D %d: dmrt_attention_inner_index misplaces %lld",
              z->heads, outer, inner, T, D, (long long)misplaced);
    }
    free(side);
    free(res);
    free(back);
    return fails;
}

/* Grouped-query attention, each group of query heads sharing one k and v head, against the
 * plain kernels on the repeated k and v (see the top); the query heads' inputs are in's. */
static int grouped_as_repeated(const sizes *z, const float *in, float scale, int operands, float *work) {
    int fails = 0;
    const int T = z->positions, D = z->width;
    const size_t head = (size_t)T * D, n = (size_t)z->heads * head, rows = (size_t)z->heads * T;
    float *repeated = malloc(sizeof(float) * 2 * n), *plain = malloc(sizeof(float) * (4 * n + rows));
    float *grouped = malloc(sizeof(float) * (4 * n + rows));
    double *sums = malloc(sizeof(double) * 2 * n);
    for (int group = 2; group <= z->heads; group++) {
        if (z->heads % group) continue;
        const size_t kv_heads = (size_t)(z->heads / group), kv_n = kv_heads * head;
        /* k and v's kv heads: the first query-shaped head of each group in in's k and v */
        float *kv = malloc(sizeof(float) * 2 * kv_n);
        for (size_t part = 0; part < 2; part++)
            for (size_t g = 0; g < kv_heads; g++) {
                memcpy(kv + part * kv_n + g * head, in + (1 + part) * n + g * group * head, sizeof(float) * head);
                for (int r = 0; r < group; r++)
                    memcpy(repeated + part * n + (g * group + (size_t)r) * head, kv + part * kv_n + g * head,
                           sizeof(float) * head);
            }
        const float *q = in, *dout = in + 3 * n;
        float *out = plain, *lse = plain + n, *dq = plain + n + rows;
        kernels.forward(q, repeated, repeated + n, out, lse, z->heads, 1, T, D, scale, z->causal, operands, 1, work);
        kernels.backward(q, repeated, repeated + n, out, lse, dout, dq, dq + n, dq + 2 * n, z->heads, 1, T, D,
                                scale, z->causal, operands, 1, work);
        for (size_t part = 0; part < 2; part++)
            for (size_t g = 0; g < kv_heads; g++)
                for (size_t e = 0; e < head; e++) {
                    double sum = 0.0;
                    for (int r = 0; r < group; r++) sum += dq[(1 + part) * n + (g * group + (size_t)r) * head + e];
                    sums[part * kv_n + g * head + e] = sum;
                }
        float *first = NULL;
        for (int threads = 1; threads <= 3; threads += 2) {
            float *g_out = grouped, *g_lse = grouped + n, *g_dq = grouped + n + rows, *g_dk = g_dq + n, *g_dv = g_dk + kv_n;
            kernels.forward_grouped(q, kv, kv + kv_n, g_out, g_lse, z->heads, group, T, D, scale, z->causal,
                                           operands, threads, work);
            kernels.backward_grouped(q, kv, kv + kv_n, g_out, g_lse, dout, g_dq, g_dk, g_dv, z->heads, group, T, D,
                                            scale, z->causal, operands, threads, work);
            CHECK(memcmp(grouped, plain, sizeof(float) * (2 * n + rows)) == 0,
                  "heads %d in groups of %d T %d D %d causal %d, %d thread(s): out, lse or dq not the repeated heads' bits",
                  z->heads, group, T, D, z->causal, threads);
            double abs_err, ratio = worst(g_dk, sums, 2 * kv_n, &abs_err);
            printf("group  heads %d in groups of %d T %3d D %2d %-7s %s dk, dv max abs error %.3g (error/bound %.3g), %d thread(s)\n",
                   z->heads, group, T, D, z->causal ? "causal" : "every", operands_name(operands), abs_err, ratio, threads);
            CHECK(ratio <= 1.0, "heads %d in groups of %d T %d D %d causal %d: dk, dv off the repeated heads' sums by %g",
                  z->heads, group, T, D, z->causal, abs_err);
            if (!first) {
                first = malloc(sizeof(float) * 2 * kv_n);
                memcpy(first, g_dk, sizeof(float) * 2 * kv_n);
            } else {
                CHECK(memcmp(first, g_dk, sizeof(float) * 2 * kv_n) == 0,
                      "heads %d in groups of %d: dk, dv on %d threads differ from one", z->heads, group, threads);
            }
        }
        free(first);
        if (operands == DMRT_ATTENTION_F32) fails += rows_grouped_as_repeated(z, group, in, kv, repeated, scale);
        free(kv);
    }
    free(repeated);
    free(plain);
    free(grouped);
    free(sums);
    return fails;
}

static int one(const sizes *z) {
    int fails = 0;
    const size_t n = (size_t)z->heads * z->positions * z->width, rows = (size_t)z->heads * z->positions;
    float *in = malloc(sizeof(float) * 4 * n), *got = malloc(sizeof(float) * (4 * n + rows));
    double *want = calloc(4 * n + rows, sizeof(double));
    float *work = malloc(sizeof(float) * (size_t)dmrt_attention_work_floats(z->positions));
    const float *q = in, *k = in + n, *v = in + 2 * n, *dout = in + 3 * n;
    dmrt_rng rng;
    dmrt_rng_init(&rng, 7, (uint64_t)(z->positions * 100 + z->width * 10 + z->causal));
    /* q and k up to 2: scores of several units, so the row maximum moves between blocks */
    dmrt_fill_uniform(in, (int64_t)(2 * n), -2.0f, 2.0f, &rng);
    dmrt_fill_uniform(in + 2 * n, (int64_t)(2 * n), -1.0f, 1.0f, &rng);
    const float scale = 1.0f / sqrtf((float)z->width);
    reference(z, q, k, v, dout, scale, want, want + n, want + n + rows, want + 2 * n + rows, want + 3 * n + rows);
    float *out = got, *lse = got + n, *dq = got + n + rows;
    kernels.forward(q, k, v, out, lse, z->heads, 1, z->positions, z->width, scale, z->causal, DMRT_ATTENTION_F32, 1, work);
    kernels.backward(q, k, v, out, lse, dout, dq, dq + n, dq + 2 * n, z->heads, 1, z->positions, z->width, scale,
                            z->causal, DMRT_ATTENTION_F32, 1, work);
    float *row_got = malloc(sizeof(float) * (4 * n + rows));
    by_rows(z, q, k, v, dout, scale, row_got, row_got + n, row_got + n + rows, row_got + 2 * n + rows,
            row_got + 3 * n + rows);
    fails += heads_inner_same_bits(z, in, got, row_got, scale, DMRT_ATTENTION_F32, work);
    fails += grouped_as_repeated(z, in, scale, DMRT_ATTENTION_F32, work);
    /* heads shared over 2 and 3 threads: each head is computed as one thread computes it */
    float *split = malloc(sizeof(float) * (4 * n + rows));
    for (int threads = 2; threads <= 3; threads++) {
        kernels.forward(q, k, v, split, split + n, z->heads, 1, z->positions, z->width, scale, z->causal,
                               DMRT_ATTENTION_F32, threads, work);
        kernels.backward(q, k, v, split, split + n, dout, split + n + rows, split + 2 * n + rows,
                                split + 3 * n + rows, z->heads, 1, z->positions, z->width, scale, z->causal,
                                DMRT_ATTENTION_F32, threads, work);
        CHECK(memcmp(split, got, sizeof(float) * (4 * n + rows)) == 0,
              "heads %d T %d D %d causal %d: %d threads differ from one", z->heads, z->positions, z->width, z->causal,
              threads);
    }
    free(split);
    static const char *const names[] = {"out", "lse", "dq", "dk", "dv"};
    const size_t at[] = {0, n, n + rows, 2 * n + rows, 3 * n + rows}, count[] = {n, rows, n, n, n};
    for (int kernels = 0; kernels < 2; kernels++)
        for (int t = 0; t < 5; t++) {
            const float *result = kernels ? row_got : got;
            double abs_err, ratio = worst(result + at[t], want + at[t], count[t], &abs_err);
            printf("%-6s heads %d T %3d D %2d %-7s %-3s max abs error %.3g (error/bound %.3g)\n", kernels ? "rows" : "tiled",
                   z->heads, z->positions, z->width, z->causal ? "causal" : "every", names[t], abs_err, ratio);
            CHECK(ratio <= 1.0, "%s: heads %d T %d D %d causal %d: %s off by %g", kernels ? "rows" : "tiled", z->heads,
                  z->positions, z->width, z->causal, names[t], abs_err);
        }
    free(row_got);
    free(in);
    free(got);
    free(want);
    free(work);
    return fails;
}

/* ---- bf16 operands (--precision bf16: runtime/dmrt_attention_tiles.h) ---------------- */

static float bf16_value(float x) { return dmrt_bf16_to_f32(dmrt_bf16_round(x)); }

/* dmrt_attention_product_ with bf16 operands, every transpose, beta 0 and 1, at sizes
 * around the kernel's blocks (8 rows, 32 columns, pairs along k: odd k pads a zero), against
 * the products of the rounded values in double: within f32 summation's error, (k + 2)
 * 2^-24 of the sum of the terms' magnitudes. And far from the unrounded product somewhere
 * (a product run on the f32 values would be within that bound of it). */
static int tile_products_bf16(void) {
    static const int ms[] = {1, 7, 8, 13, 64}, ns[] = {1, 16, 31, 33, 64}, ks[] = {1, 2, 3, 64, 65};
    int fails = 0;
    const int side = 65, room = (side + 3) * (side + 3); /* operands with leading dimensions up to side + 3 */
    float *a = malloc(sizeof(float) * room), *b = malloc(sizeof(float) * room);
    float *c = malloc(sizeof(float) * room), *before = malloc(sizeof(float) * room);
    float *pack = malloc(sizeof(float) * (size_t)dmrt_attention_pack_floats_(64, side));
    dmrt_rng rng;
    dmrt_rng_init(&rng, 11, 0);
    double worst_ratio = 0.0, farthest = 0.0;
    for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++)
                for (int variant = 0; variant < 8; variant++) {
                    const int m = ms[mi], n = ns[ni], k = ks[ki], ta = variant & 1, tb = variant >> 1 & 1;
                    const float beta = (float)(variant >> 2), alpha = 0.75f;
                    /* leading dimensions past the operand's width: the kernel reads windows */
                    const int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
                    dmrt_fill_uniform(a, room, -2.0f, 2.0f, &rng);
                    dmrt_fill_uniform(b, room, -2.0f, 2.0f, &rng);
                    dmrt_fill_uniform(before, room, -1.0f, 1.0f, &rng);
                    memcpy(c, before, sizeof(float) * room);
                    dmrt_attention_product_(DMRT_ATTENTION_BF16, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) {
                            double rounded = 0.0, plain = 0.0, magnitude = 0.0;
                            for (int t = 0; t < k; t++) {
                                const float x = ta ? a[t * lda + i] : a[i * lda + t], y = tb ? b[j * ldb + t] : b[t * ldb + j];
                                rounded += (double)bf16_value(x) * bf16_value(y);
                                plain += (double)x * y;
                                magnitude += fabs((double)bf16_value(x) * bf16_value(y));
                            }
                            const double base = beta * before[i * ldc + j];
                            const double want = alpha * rounded + base, got = c[i * ldc + j];
                            const double bound = (k + 2) * 0x1p-24 * (alpha * magnitude + fabs(base)) + 1e-30;
                            const double ratio = fabs(got - want) / bound;
                            if (!(ratio <= worst_ratio)) worst_ratio = ratio;
                            if (fabs(got - (alpha * plain + base)) / bound > farthest)
                                farthest = fabs(got - (alpha * plain + base)) / bound;
                            CHECK(ratio <= 1.0, "bf16 tile product %d x %d x %d ta %d tb %d beta %g: [%d][%d] %.9g, want %.9g",
                                  m, n, k, ta, tb, beta, i, j, got, want);
                        }
                    /* nothing past the product's columns written */
                    for (int i = 0; i < m; i++)
                        CHECK(c[i * ldc + n] == before[i * ldc + n], "bf16 tile product %d x %d x %d: column %d written",
                              m, n, k, n);
                }
    printf("bf16 tile products (%s): error/bound at most %.3g; from the unrounded products up to %.3g bounds\n",
           DMRT_ATTENTION_BF16_KERNEL ? "vdpbf16ps kernel" : "rounded, then dmrt_sgemm", worst_ratio, farthest);
    CHECK(farthest > 100.0, "bf16 tile products: within %.3g bounds of the unrounded product (were they rounded?)", farthest);
    free(a);
    free(b);
    free(c);
    free(before);
    free(pack);
    return fails;
}

#if DMRT_ATTENTION_BF16_KERNEL
/* The packing of a transposed right operand (the attention's kT and vT), which transposes
 * 16 x 16 words of rounded pairs: bit for bit the layout written out one value at a time
 * (pair p, column j: b[j][2p] and b[j][2p + 1] rounded, 0 past k; zeros from column n to
 * the packed width), on every k and n from 1 to 70, leading dimensions k and 131, values
 * that include infinities, NaNs, subnormals, zeros and halfway ties. */
static int pack_transposed_bf16(void) {
    int fails = 0;
    enum { ROWS = 70, LD = 131 };
    float *b = malloc(sizeof(float) * ROWS * LD);
    uint16_t *got = malloc(sizeof(uint16_t) * 36 * 2 * 96), *want = malloc(sizeof(uint16_t) * 36 * 2 * 96);
    dmrt_rng rng;
    dmrt_rng_init(&rng, 12, 0);
    for (int i = 0; i < ROWS * LD; i++) {
        uint64_t r = dmrt_rng_u64(&rng);
        uint32_t u = (uint32_t)r;
        switch ((r >> 32) % 8) {
        case 0: u = (u & 0x807fffffu) | 0x7f800000u; break; /* an infinity or a NaN */
        case 1: u &= 0x807fffffu; break;                     /* a subnormal or a zero */
        case 2: u = (u & 0xffff0000u) | 0x8000u; break;      /* halfway between two bf16s */
        default: break;
        }
        memcpy(&b[i], &u, sizeof u);
    }
    for (int k = 1; k <= ROWS; k++)
        for (int n = 1; n <= ROWS; n++)
            for (int wide = 0; wide < 2; wide++) {
                const int64_t ldb = wide ? LD : k, cols = dmrt_attention_packed_cols_(n), pairs = (k + 1) / 2;
                for (int64_t p = 0; p < pairs; p++)
                    for (int64_t j = 0; j < cols; j++) {
                        int inside = j < n;
                        want[p * 2 * cols + 2 * j] = inside ? dmrt_bf16_round(b[j * ldb + 2 * p]) : 0;
                        want[p * 2 * cols + 2 * j + 1] = inside && 2 * p + 1 < k ? dmrt_bf16_round(b[j * ldb + 2 * p + 1]) : 0;
                    }
                dmrt_attention_pack_right_bf16_(1, k, n, b, ldb, got);
                CHECK(memcmp(got, want, sizeof(uint16_t) * (size_t)(pairs * 2 * cols)) == 0,
                      "packing b^T (k %d, n %d, ldb %lld) differs from the layout written value by value", k, n,
                      (long long)ldb);
            }
    printf("bf16 packing of transposed right operands: k, n in 1..70, two leading dimensions: %s\n",
           fails ? "differs" : "bit for bit");
    free(b);
    free(got);
    free(want);
    return fails;
}
#endif

/* The largest |got - want| / bound over n values, bound = 1e-5 + 2^-6 max |want|: the
 * probabilities and the scores' gradients are rounded to bf16 (2^-9 relative) before their
 * products, which the double reference does not do (measured: up to 0.41 of the bound, on
 * dq of three heads 1 wide; a transposed or misplaced operand is off by the whole). */
static double worst_bf16(const float *got, const double *want, size_t n, double *abs_err) {
    double largest = 0.0, ratio = 0.0;
    for (size_t i = 0; i < n; i++) largest = fmax(largest, fabs(want[i]));
    *abs_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]), r = e / (1e-5 + 0x1p-6 * largest);
        if (e > *abs_err) *abs_err = e;
        if (!(r <= ratio)) ratio = r;
    }
    return ratio;
}

/* The kernels with bf16 operands: against the double reference on q, k, v and dout rounded
 * to bf16 (worst_bf16's bound; lse, from f32 sums of exps of the rounded products' scores,
 * within worst's), the same bits on 1 and 3 threads, heads side by side and grouped as the
 * f32 kernels are checked, and not the f32 kernel's result. */
static int one_bf16(const sizes *z) {
    int fails = 0;
    const size_t n = (size_t)z->heads * z->positions * z->width, rows = (size_t)z->heads * z->positions;
    float *in = malloc(sizeof(float) * 4 * n), *rounded = malloc(sizeof(float) * 4 * n);
    float *got = malloc(sizeof(float) * (4 * n + rows)), *other = malloc(sizeof(float) * (4 * n + rows));
    double *want = calloc(4 * n + rows, sizeof(double));
    float *work = malloc(sizeof(float) * (size_t)dmrt_attention_work_floats_of(DMRT_ATTENTION_BF16, z->positions, z->width));
    dmrt_rng rng;
    dmrt_rng_init(&rng, 9, (uint64_t)(z->positions * 100 + z->width * 10 + z->causal));
    dmrt_fill_uniform(in, (int64_t)(2 * n), -2.0f, 2.0f, &rng);
    dmrt_fill_uniform(in + 2 * n, (int64_t)(2 * n), -1.0f, 1.0f, &rng);
    for (size_t i = 0; i < 4 * n; i++) rounded[i] = bf16_value(in[i]);
    const float scale = 1.0f / sqrtf((float)z->width);
    reference(z, rounded, rounded + n, rounded + 2 * n, rounded + 3 * n, scale, want, want + n, want + n + rows,
              want + 2 * n + rows, want + 3 * n + rows);
    const float *q = in, *k = in + n, *v = in + 2 * n, *dout = in + 3 * n;
    float *dq = got + n + rows;
    kernels.forward(q, k, v, got, got + n, z->heads, 1, z->positions, z->width, scale, z->causal,
                           DMRT_ATTENTION_BF16, 1, work);
    kernels.backward(q, k, v, got, got + n, dout, dq, dq + n, dq + 2 * n, z->heads, 1, z->positions, z->width,
                            scale, z->causal, DMRT_ATTENTION_BF16, 1, work);
    static const char *const names[] = {"out", "lse", "dq", "dk", "dv"};
    const size_t at[] = {0, n, n + rows, 2 * n + rows, 3 * n + rows}, count[] = {n, rows, n, n, n};
    for (int t = 0; t < 5; t++) {
        double abs_err, ratio = t == 1 ? worst(got + at[t], want + at[t], count[t], &abs_err)
                                       : worst_bf16(got + at[t], want + at[t], count[t], &abs_err);
        printf("bf16   heads %d T %3d D %2d %-7s %-3s max abs error %.3g (error/bound %.3g)\n", z->heads, z->positions,
               z->width, z->causal ? "causal" : "every", names[t], abs_err, ratio);
        CHECK(ratio <= 1.0, "bf16: heads %d T %d D %d causal %d: %s off by %g", z->heads, z->positions, z->width,
              z->causal, names[t], abs_err);
    }
    /* heads shared over 3 threads: each computed as one thread computes it */
    kernels.forward(q, k, v, other, other + n, z->heads, 1, z->positions, z->width, scale, z->causal,
                           DMRT_ATTENTION_BF16, 3, work);
    kernels.backward(q, k, v, other, other + n, dout, other + n + rows, other + 2 * n + rows,
                            other + 3 * n + rows, z->heads, 1, z->positions, z->width, scale, z->causal,
                            DMRT_ATTENTION_BF16, 3, work);
    CHECK(memcmp(other, got, sizeof(float) * (4 * n + rows)) == 0, "bf16: heads %d T %d D %d causal %d: 3 threads differ from one",
          z->heads, z->positions, z->width, z->causal);
    fails += heads_inner_same_bits(z, in, got, NULL, scale, DMRT_ATTENTION_BF16, work);
    fails += grouped_as_repeated(z, in, scale, DMRT_ATTENTION_BF16, work);
    /* the f32 kernel on the same inputs: the rounding must show in the result */
    float *f32_work = malloc(sizeof(float) * (size_t)dmrt_attention_work_floats(z->positions));
    kernels.forward(q, k, v, other, other + n, z->heads, 1, z->positions, z->width, scale, z->causal,
                           DMRT_ATTENTION_F32, 1, f32_work);
    double apart = 0.0;
    for (size_t i = 0; i < n; i++) apart = fmax(apart, fabs((double)other[i] - got[i]));
    CHECK(apart > 1e-5, "bf16: heads %d T %d D %d causal %d: out within %g of the f32 kernel's (no rounding?)", z->heads,
          z->positions, z->width, z->causal, apart);
    free(f32_work);
    free(in);
    free(rounded);
    free(got);
    free(other);
    free(want);
    free(work);
    return fails;
}

int main(void) {
    static const sizes cases[] = {
        {1, 1, 3, 1},  {3, 5, 3, 1},   {1, 63, 16, 1}, {1, 64, 16, 1}, {2, 65, 3, 1},
        {1, 130, 16, 1}, {3, 130, 1, 1}, {2, 65, 3, 0},  {1, 130, 16, 0}, {1, 1, 3, 0},
        {4, 70, 5, 1},  {6, 9, 4, 0},
    };
    /* first the set this file's own flags call (dmrt_attention.h), then every other one
     * libdmrt was built with (runtime/meson.build passes DMRT_TEST_ATTENTION_<ISA>) */
    const kernel_set sets[] = {
        {"this build's (" DMRT_ATTENTION_ISA_NAME ")", 1, dmrt_attention_forward, dmrt_attention_forward_grouped,
         dmrt_attention_backward, dmrt_attention_backward_grouped},
        KERNEL_SET(base, 1),
#ifdef DMRT_TEST_ATTENTION_AVX2
        KERNEL_SET(avx2, CPU_AVX2),
#endif
#ifdef DMRT_TEST_ATTENTION_AVX512
        KERNEL_SET(avx512, CPU_AVX512),
#endif
#ifdef DMRT_TEST_ATTENTION_AVX512BF16
        KERNEL_SET(avx512bf16, CPU_AVX512 && DMRT_CPU_SUPPORTS("avx512bf16")),
#endif
    };
    int fails = 0;
    fails += tile_products_bf16();
#if DMRT_ATTENTION_BF16_KERNEL
    fails += pack_transposed_bf16();
#endif
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
        kernels = sets[s];
        if (!kernels.runs) {
            printf("kernels %s: skipped, this CPU lacks their instructions\n", kernels.name);
            continue;
        }
        printf("kernels %s\n", kernels.name);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) fails += one(&cases[i]);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) fails += one_bf16(&cases[i]);
    }
    if (fails) fprintf(stderr, "%d checks failed\n", fails);
    return fails ? 1 : 0;
}
