/* test_gpu_kernels.c: libdmrt_cuda against plain C references that mirror the C target's
 * kernels (codegen/dialect_c.c), on random inputs:
 *
 *   memory, copies, faults, argument errors
 *   sgemm: every transpose pair, padded strides, batched, k = 0
 *   softmax (+ fused causal mask and scale), softmax_grad, causal_mask
 *   layernorm, layernorm_grad, layernorm_wgrad (deterministic: two runs, same bits)
 *   cross-entropy and its gradient, whole and vocabulary-parallel on 2 thread ranks,
 *     with a bad target recorded as a fault
 *   embedding and its gradient (the gradient bit for bit the C target's sums, twice)
 *   SGD and AdamW (bit for bit: the same float operations in the same order)
 *   the staged collectives on 2 thread ranks sharing device 0, against exact sums
 *   nccl-1rank: NCCL at one rank (asked for): a one-rank NCCL communicator on a mesh axis
 *     of size 1, every collective on it (and on the world) through NCCL, exact
 *
 * Tolerances are stated at each comparison. Prints FAIL lines and exits 1 on any
 * failure; without a CUDA device prints SKIP and exits 77 (meson: skipped). */
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_comm.h"
#include "dmrt_cuda.h"

static atomic_int failures;

/* One printf per line: the two thread ranks report at the same time. */
static void fail(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("FAIL: %s\n", line);
    fflush(stdout);
    atomic_fetch_add(&failures, 1);
}

#define CHECK(cond, ...)                    \
    do {                                    \
        if (!(cond)) fail(__VA_ARGS__);     \
    } while (0)

/* A failed call makes every later result meaningless: stop the test there. */
#define GPU_OK(g, call)                                                                      \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != DMRT_OK) {                                                                \
            printf("FAIL %s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #call, rc_,       \
                   dmrt_gpu_error(g));                                                       \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------ */

static void *xmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        printf("FAIL: out of host memory\n");
        exit(1);
    }
    return p;
}

static float *host_floats(int64_t n) { return xmalloc((size_t)n * sizeof(float)); }

static void fill(float *p, int64_t n, uint64_t seed, float lo, float hi) {
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, 7);
    dmrt_fill_uniform(p, n, lo, hi, &rng);
}

static void fill_ids(int32_t *ids, int64_t n, uint64_t seed, int32_t below) {
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, 11);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(dmrt_rng_u64(&rng) % (uint64_t)below);
}

static void *to_device(dmrt_gpu *g, const void *host, size_t bytes) {
    void *d = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &d, bytes));
    if (bytes) GPU_OK(g, dmrt_gpu_copy(g, d, host, bytes, DMRT_HOST_TO_DEVICE));
    return d;
}

static float *device_floats(dmrt_gpu *g, int64_t n) {
    void *d = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &d, (size_t)n * sizeof(float)));
    return d;
}

static void from_device(dmrt_gpu *g, void *host, const void *dev, size_t bytes) {
    GPU_OK(g, dmrt_gpu_copy(g, host, dev, bytes, DMRT_DEVICE_TO_HOST));
}

/* Every element within atol + rtol * |want|; where want is exactly 0 (keys a causal mask
 * hid), got must be exactly 0 too when zeros_exact. */
static void compare(const char *what, const float *got, const float *want, int64_t n,
                    double rtol, double atol, int zeros_exact) {
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        double lim = atol + rtol * fabs((double)want[i]);
        int ok = d <= lim || (isnan(got[i]) && isnan(want[i]));
        if (zeros_exact && want[i] == 0.0f && got[i] != 0.0f) ok = 0;
        if (ok) continue;
        bad++;
        double ratio = isnan(d) ? INFINITY : d / lim;
        if (worst < 0 || ratio > worst_ratio) {
            worst = i;
            worst_ratio = ratio;
        }
    }
    if (bad)
        fail("%s: %lld of %lld elements off (rtol %g, atol %g); worst [%lld]: got %.9g, want %.9g",
             what, (long long)bad, (long long)n, rtol, atol, (long long)worst,
             (double)got[worst], (double)want[worst]);
    else
        printf("ok   %s (%lld elements)\n", what, (long long)n);
}

/* The same bits (NaN payloads aside, none here). */
static void compare_bits(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) == 0) continue;
        fail("%s: not bit-identical at [%lld]: got %.9g, want %.9g", what, (long long)i,
             (double)got[i], (double)want[i]);
        return;
    }
    printf("ok   %s (%lld elements, bit for bit)\n", what, (long long)n);
}

/* ---- references: codegen/dialect_c.c's kernels, as plain functions ------------------------- */

/* lane_sum: 8 float lanes, then a fixed tree */
static float lane_sum(const float *a, const float *b, int64_t keys, int64_t inner) {
    float lanes[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= keys; j += 8)
        for (int lane = 0; lane < 8; lane++)
            lanes[lane] += b ? a[(j + lane) * inner] * b[(j + lane) * inner] : a[(j + lane) * inner];
    for (; j < keys; j++) lanes[0] += b ? a[j * inner] * b[j * inner] : a[j * inner];
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

static int64_t ref_keys(int64_t r, int64_t n, int64_t causal_queries) {
    return causal_queries ? r % causal_queries + (n - causal_queries + 1) : n;
}

static void ref_softmax(const float *x, float *out, int64_t outer, int64_t n, int64_t inner,
                        float scale, int64_t cq) {
    for (int64_t r = 0; r < outer; r++)
        for (int64_t i = 0; i < inner; i++) {
            const int64_t base = r * n * inner + i, keys = ref_keys(r, n, cq);
            const float *row = x + base;
            float *o = out + base;
            float max = row[0];
            for (int64_t j = 1; j < keys; j++) max = row[j * inner] > max ? row[j * inner] : max;
            const float scaled_max = max * scale;
            for (int64_t j = 0; j < keys; j++) o[j * inner] = expf(row[j * inner] * scale - scaled_max);
            const float inv_sum = 1.0f / lane_sum(o, NULL, keys, inner);
            for (int64_t j = 0; j < keys; j++) o[j * inner] *= inv_sum;
            for (int64_t j = keys; j < n; j++) o[j * inner] = 0.0f;
        }
}

static void ref_softmax_grad(const float *y, const float *dy, float *out, int64_t outer,
                             int64_t n, int64_t inner, float scale, int64_t cq) {
    for (int64_t r = 0; r < outer; r++)
        for (int64_t i = 0; i < inner; i++) {
            const int64_t base = r * n * inner + i, keys = ref_keys(r, n, cq);
            const float dot = lane_sum(y + base, dy + base, keys, inner);
            for (int64_t j = 0; j < keys; j++)
                out[base + j * inner] = scale * (y[base + j * inner] * (dy[base + j * inner] - dot));
            for (int64_t j = keys; j < n; j++) out[base + j * inner] = 0.0f;
        }
}

static void ref_causal_mask(const float *x, float *out, int64_t outer, int64_t nq, int64_t nk,
                            float fill_value) {
    for (int64_t r = 0; r < outer; r++)
        for (int64_t q = 0; q < nq; q++)
            for (int64_t k = 0; k < nk; k++)
                out[(r * nq + q) * nk + k] = k > q + (nk - nq) ? fill_value : x[(r * nq + q) * nk + k];
}

/* Layernorm's double sums one after another here; dialect_c_rows.c adds them in 8 double lanes
 * (vectorised), which rounds to the same mean and rstd but for the rare row near a float
 * boundary: far inside the tolerances the layernorm cases compare with. */
static void ref_ln_stats(const float *x, int64_t n, float eps, float *mean, float *rstd) {
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t j = 0; j < n; j++) sum += x[j];
    const float m = (float)(sum / (double)n);
    for (int64_t j = 0; j < n; j++) sum_sq += (double)(x[j] - m) * (x[j] - m);
    *mean = m;
    *rstd = (float)(1.0 / sqrt(sum_sq / (double)n + eps));
}

static void ref_layernorm(const float *x, const float *w, const float *b, float *out,
                          int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float mean, rstd;
        ref_ln_stats(x + r * n, n, eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++) out[r * n + j] = (x[r * n + j] - mean) * rstd * w[j] + b[j];
    }
}

static void ref_layernorm_grad(const float *x, const float *w, const float *dy, float *out,
                               int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n, *dyr = dy + r * n;
        float mean, rstd;
        ref_ln_stats(xr, n, eps, &mean, &rstd);
        double s = 0.0, sx = 0.0;
        for (int64_t j = 0; j < n; j++) {
            const float dxhat = dyr[j] * w[j];
            s += dxhat;
            sx += (double)dxhat * ((xr[j] - mean) * rstd);
        }
        const float md = (float)(s / (double)n), mdx = (float)(sx / (double)n);
        for (int64_t j = 0; j < n; j++)
            out[r * n + j] = rstd * (dyr[j] * w[j] - md - (xr[j] - mean) * rstd * mdx);
    }
}

static void ref_layernorm_wgrad(const float *x, const float *dy, float *out, int64_t rows,
                                int64_t n, float eps) {
    memset(out, 0, (size_t)n * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        float mean, rstd;
        ref_ln_stats(x + r * n, n, eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++) out[j] += dy[r * n + j] * ((x[r * n + j] - mean) * rstd);
    }
}

/* Rows whose target is outside [0, classes) add nothing (the GPU records a fault). */
static float ref_xent(const float *logits, const int32_t *targets, int64_t rows,
                      int64_t classes, int64_t mean_rows) {
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = logits + r * classes;
        const int32_t t = targets[r];
        if (t < 0 || t >= classes) continue;
        float max = row[0];
        for (int64_t c = 1; c < classes; c++) max = row[c] > max ? row[c] : max;
        double sum = 0.0;
        for (int64_t c = 0; c < classes; c++) sum += exp((double)(row[c] - max));
        total += log(sum) + (double)max - (double)row[t];
    }
    return (float)(total / (double)mean_rows);
}

/* The sum as the statistics store it (a float); rows whose target is out of range get
 * zeros (the GPU records a fault). */
static void ref_xent_grad(const float *logits, const int32_t *targets, float dloss, float *out,
                          int64_t rows, int64_t classes, int64_t mean_rows) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = logits + r * classes;
        float *drow = out + r * classes;
        if (targets[r] < 0 || targets[r] >= classes) {
            memset(drow, 0, (size_t)classes * sizeof(float));
            continue;
        }
        float max = row[0];
        for (int64_t c = 1; c < classes; c++) max = row[c] > max ? row[c] : max;
        double sum = 0.0;
        for (int64_t c = 0; c < classes; c++) sum += exp((double)(row[c] - max));
        sum = (double)(float)sum;
        const float scale = dloss / (float)mean_rows;
        for (int64_t c = 0; c < classes; c++) drow[c] = (float)(exp((double)(row[c] - max)) / sum) * scale;
        drow[targets[r]] -= scale;
    }
}

/* stats (rows, 3): max, sum of exp(logit - max) as a float, the target's logit; a row with
 * a bad target (0, 1, 0). */
static void ref_xent_stats(const float *logits, const int32_t *targets, float *stats,
                           int64_t rows, int64_t classes) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = logits + r * classes;
        float *s = stats + r * 3;
        if (targets[r] < 0 || targets[r] >= classes) {
            s[0] = 0.0f, s[1] = 1.0f, s[2] = 0.0f;
            continue;
        }
        float max = row[0];
        for (int64_t c = 1; c < classes; c++) max = row[c] > max ? row[c] : max;
        double sum = 0.0;
        for (int64_t c = 0; c < classes; c++) sum += exp((double)(row[c] - max));
        s[0] = max, s[1] = (float)sum, s[2] = row[targets[r]];
    }
}

static void ref_embed(const float *table, const int32_t *ids, float *out, int64_t rows,
                      int64_t n, int64_t cols, int64_t vocab, int64_t first_row) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = (int64_t)ids[r] - first_row;
        const int ok = ids[r] >= 0 && ids[r] < vocab && row >= 0 && row < n;
        for (int64_t j = 0; j < cols; j++) out[r * cols + j] = ok ? table[row * cols + j] : 0.0f;
    }
}

static void ref_embed_grad(const int32_t *ids, const float *dy, float *out, int64_t rows,
                           int64_t n, int64_t cols, int64_t first_row) {
    memset(out, 0, (size_t)(n * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = (int64_t)ids[r] - first_row;
        if (row < 0 || row >= n) continue;
        for (int64_t j = 0; j < cols; j++) out[row * cols + j] += dy[r * cols + j];
    }
}

static void ref_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float wd,
                    float mom, float damp, int nesterov, int64_t step) {
    for (int64_t i = 0; i < n; i++) {
        float d = wd != 0.0f ? g[i] + wd * p[i] : g[i];
        if (buf) {
            buf[i] = step == 1 ? d : mom * buf[i] + damp * d;
            d = nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] -= lr * d;
    }
}

static void ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float b1,
                      float b1c, float b2, float b2c, float eps, float decay, float step_size,
                      float bc2_sqrt) {
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i];
        p[i] *= decay;
        m[i] = b1 * m[i] + b1c * gi;
        v[i] = b2 * v[i] + b2c * gi * gi;
        const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] -= step_size * (m[i] / denom);
    }
}

/* ---- memory, copies, argument errors -------------------------------------------------------- */

static void test_memory(dmrt_gpu *g) {
    CHECK(dmrt_gpu_device_name(g)[0] != 0, "empty device name");
    printf("device: %s\n", dmrt_gpu_device_name(g));
    void *p = (void *)&p;
    GPU_OK(g, dmrt_gpu_alloc(g, &p, 0));
    CHECK(p == NULL, "alloc of 0 bytes gave %p", p);
    const int64_t n = 1 << 18;
    float *d = device_floats(g, n);
    CHECK(dmrt_gpu_peak_bytes(g) >= (size_t)n * sizeof(float), "peak %zu after a %zu-byte alloc",
          dmrt_gpu_peak_bytes(g), (size_t)n * sizeof(float));
    float *h = host_floats(n);
    fill(h, n, 1, -1, 1);
    from_device(g, h, d, (size_t)n * sizeof(float));
    int64_t nonzero = 0;
    for (int64_t i = 0; i < n; i++) nonzero += h[i] != 0.0f;
    CHECK(nonzero == 0, "dmrt_gpu_alloc: %lld nonzero floats", (long long)nonzero);
    /* host -> device -> device -> host round trip, and zero */
    float *h2 = host_floats(n);
    fill(h, n, 2, -1, 1);
    float *d2 = device_floats(g, n);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_copy(g, d2, d, (size_t)n * sizeof(float), DMRT_DEVICE_TO_DEVICE));
    from_device(g, h2, d2, (size_t)n * sizeof(float));
    compare_bits("copies", h2, h, n);
    GPU_OK(g, dmrt_gpu_zero(g, d2, 16 * sizeof(float)));
    from_device(g, h2, d2, 32 * sizeof(float));
    CHECK(h2[0] == 0.0f && h2[15] == 0.0f && h2[16] == h[16], "dmrt_gpu_zero");
    GPU_OK(g, dmrt_gpu_sync(g));

    int rc = dmrt_gpu_copy(g, d, h, 4, (dmrt_copy_kind)9);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "kind"), "bad copy kind: %d, \"%s\"",
          rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_sgemm(g, 0, 0, (int64_t)1 << 33, 4, 4, d, 4, d, 4, 0.0f, d2, 4, 1, 0, 0, 0);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "32-bit"), "huge sgemm: %d, \"%s\"",
          rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_softmax(g, d, d2, 4, 8, 2, 1.0f, 4);
    CHECK(rc == DMRT_ERR_ARG && strstr(dmrt_gpu_error(g), "causal"),
          "causal softmax with inner 2: %d, \"%s\"", rc, dmrt_gpu_error(g));
    rc = dmrt_gpu_allreduce_sum(g, NULL, d, 4, "x");
    CHECK(rc == DMRT_ERR_COMM && strstr(dmrt_gpu_error(g), "NULL"), "NULL comm: %d, \"%s\"", rc,
          dmrt_gpu_error(g));
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 0, "a fault (site %d) before any kernel ran", f.site);
    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(h2);
}

/* ---- sgemm ------------------------------------------------------------------------------------ */

static void sgemm_case(dmrt_gpu *g, int ta, int tb, int64_t batch, float beta) {
    const int64_t m = 37, n = 53, k = 29, pad = 3;
    const int64_t arows = ta ? k : m, lda = (ta ? m : k) + pad;
    const int64_t brows = tb ? n : k, ldb = (tb ? k : n) + pad;
    const int64_t ldc = n + pad;
    const int64_t sa = arows * lda + 5, sb = brows * ldb + 6, sc = m * ldc + 7;
    float *a = host_floats(batch * sa), *b = host_floats(batch * sb);
    float *c = host_floats(batch * sc), *want = host_floats(batch * sc);
    fill(a, batch * sa, 10 + (uint64_t)(ta * 2 + tb), -1, 1);
    fill(b, batch * sb, 20 + (uint64_t)(ta * 2 + tb), -1, 1);
    fill(c, batch * sc, 30, -1, 1);
    memcpy(want, c, (size_t)(batch * sc) * sizeof(float));
    for (int64_t i = 0; i < batch; i++)
        dmrt_sgemm_ref(ta, tb, m, n, k, 1.0f, a + i * sa, lda, b + i * sb, ldb, beta,
                       want + i * sc, ldc);
    float *da = to_device(g, a, (size_t)(batch * sa) * sizeof(float));
    float *db = to_device(g, b, (size_t)(batch * sb) * sizeof(float));
    float *dc = to_device(g, c, (size_t)(batch * sc) * sizeof(float));
    GPU_OK(g, dmrt_gpu_sgemm(g, ta, tb, m, n, k, da, lda, db, ldb, beta, dc, ldc, batch, sa, sb, sc));
    from_device(g, c, dc, (size_t)(batch * sc) * sizeof(float));
    char what[96];
    snprintf(what, sizeof what, "sgemm ta=%d tb=%d batch=%lld beta=%g", ta, tb, (long long)batch,
             (double)beta);
    /* strict fp32 products of 29 terms in [-1, 1]; padding and gaps must stay as they were */
    compare(what, c, want, batch * sc, 1e-5, 2e-5, 0);
    dmrt_gpu_free(g, da);
    dmrt_gpu_free(g, db);
    dmrt_gpu_free(g, dc);
    free(a);
    free(b);
    free(c);
    free(want);
}

static void test_sgemm(dmrt_gpu *g) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            sgemm_case(g, ta, tb, 1, 0.0f);
            sgemm_case(g, ta, tb, 3, 1.0f);
        }
    sgemm_case(g, 1, 0, 4, 0.0f);
    /* k = 0 with beta 0 clears C */
    float h[6] = {1, 2, 3, 4, 5, 6};
    float *dc = to_device(g, h, sizeof h);
    GPU_OK(g, dmrt_gpu_sgemm(g, 0, 0, 2, 3, 0, NULL, 1, NULL, 3, 0.0f, dc, 3, 1, 0, 0, 0));
    from_device(g, h, dc, sizeof h);
    CHECK(h[0] == 0 && h[5] == 0, "sgemm k=0 beta=0 left C[0] = %g", (double)h[0]);
    dmrt_gpu_free(g, dc);
}

/* ---- softmax and the mask ----------------------------------------------------------------------- */

typedef struct softmax_case {
    int64_t outer, n, inner;
    float scale;
    int64_t causal_queries;
} softmax_case;

static void test_softmax(dmrt_gpu *g) {
    static const softmax_case cases[] = {
        {7, 50304, 1, 1.0f, 0},       /* a vocabulary-sized row */
        {5, 9, 4, 1.0f, 0},           /* along a middle dim */
        {33, 1000, 1, 0.5f, 0},
        {2 * 3 * 64, 64, 1, 0.125f, 64},  /* causal attention, 2 x 3 heads x 64 queries */
        {2 * 48, 80, 1, 0.125f, 48},  /* more keys than queries */
        {1024, 1024, 1, 0.03125f, 1024},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const softmax_case *k = &cases[ci];
        const int64_t total = k->outer * k->n * k->inner;
        float *x = host_floats(total), *dy = host_floats(total);
        float *want = host_floats(total), *want_dx = host_floats(total), *got = host_floats(total);
        fill(x, total, 100 + ci, -4, 4);
        fill(dy, total, 200 + ci, -1, 1);
        ref_softmax(x, want, k->outer, k->n, k->inner, k->scale, k->causal_queries);
        ref_softmax_grad(want, dy, want_dx, k->outer, k->n, k->inner, k->scale, k->causal_queries);
        float *dx = to_device(g, x, (size_t)total * sizeof(float));
        float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
        float *dy_in = to_device(g, want, (size_t)total * sizeof(float));
        float *dout = device_floats(g, total);
        char what[128];
        snprintf(what, sizeof what, "softmax (%lld, %lld, %lld) scale %g causal %lld",
                 (long long)k->outer, (long long)k->n, (long long)k->inner, (double)k->scale,
                 (long long)k->causal_queries);
        GPU_OK(g, dmrt_gpu_softmax(g, dx, dout, k->outer, k->n, k->inner, k->scale,
                                   k->causal_queries));
        from_device(g, got, dout, (size_t)total * sizeof(float));
        /* float sums in another order (the C target's 8 running lanes over 50304 classes
         * drift by a few 1e-6), CUDA's expf within 2 ulp; hidden keys exactly 0 */
        compare(what, got, want, total, 1e-4, 1e-7, 1);
        /* the gradient from the reference y, so that only the kernel is measured */
        GPU_OK(g, dmrt_gpu_softmax_grad(g, dy_in, ddy, dout, k->outer, k->n, k->inner, k->scale,
                                        k->causal_queries));
        from_device(g, got, dout, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "softmax_grad (%lld, %lld, %lld) scale %g causal %lld",
                 (long long)k->outer, (long long)k->n, (long long)k->inner, (double)k->scale,
                 (long long)k->causal_queries);
        compare(what, got, want_dx, total, 1e-4, 1e-6, 1);
        dmrt_gpu_free(g, dx);
        dmrt_gpu_free(g, ddy);
        dmrt_gpu_free(g, dy_in);
        dmrt_gpu_free(g, dout);
        free(x);
        free(dy);
        free(want);
        free(want_dx);
        free(got);
    }

    const int64_t outer = 3, nq = 5, nk = 8, total = outer * nq * nk;
    float *x = host_floats(total), *want = host_floats(total), *got = host_floats(total);
    fill(x, total, 300, -1, 1);
    ref_causal_mask(x, want, outer, nq, nk, -INFINITY);
    float *dx = to_device(g, x, (size_t)total * sizeof(float)), *dout = device_floats(g, total);
    GPU_OK(g, dmrt_gpu_causal_mask(g, dx, dout, outer, nq, nk, -INFINITY));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    compare_bits("causal_mask (3, 5 queries, 8 keys)", got, want, total);
    dmrt_gpu_free(g, dx);
    dmrt_gpu_free(g, dout);
    free(x);
    free(want);
    free(got);
}

/* ---- layernorm -------------------------------------------------------------------------------- */

static void layernorm_case(dmrt_gpu *g, int64_t rows, int64_t n, uint64_t seed) {
    const float eps = 1e-5f;
    const int64_t total = rows * n;
    float *x = host_floats(total), *dy = host_floats(total), *w = host_floats(n),
          *b = host_floats(n);
    float *want = host_floats(total), *got = host_floats(total);
    fill(x, total, seed, -2, 2);
    for (int64_t i = 0; i < total; i++) x[i] += (float)(i / n % 7);  /* rows with a mean */
    fill(dy, total, seed + 1, -1, 1);
    fill(w, n, seed + 2, 0.5f, 1.5f);
    fill(b, n, seed + 3, -0.5f, 0.5f);
    float *dx = to_device(g, x, (size_t)total * sizeof(float));
    float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
    float *dw = to_device(g, w, (size_t)n * sizeof(float));
    float *db = to_device(g, b, (size_t)n * sizeof(float));
    float *dout = device_floats(g, total);
    char what[96];

    ref_layernorm(x, w, b, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm(g, dx, dw, db, dout, rows, n, eps));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "layernorm (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, total, 1e-5, 1e-5, 0);

    ref_layernorm_grad(x, w, dy, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm_grad(g, dx, dw, ddy, dout, rows, n, eps));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "layernorm_grad (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, total, 1e-4, 1e-5, 0);

    /* sums over rows in another grouping: relative to the size of the sum */
    float *got2 = host_floats(n);
    float *dscratch = device_floats(g, dmrt_cuda_layernorm_wgrad_scratch_floats(rows, n));
    ref_layernorm_wgrad(x, dy, want, rows, n, eps);
    GPU_OK(g, dmrt_gpu_layernorm_wgrad(g, dx, ddy, dout, rows, n, eps, dscratch));
    from_device(g, got, dout, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld)", (long long)rows, (long long)n);
    compare(what, got, want, n, 1e-4, 1e-5 * sqrt((double)rows), 0);
    GPU_OK(g, dmrt_gpu_zero(g, dout, (size_t)n * sizeof(float)));
    GPU_OK(g, dmrt_gpu_layernorm_wgrad(g, dx, ddy, dout, rows, n, eps, dscratch));
    from_device(g, got2, dout, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "layernorm_wgrad (%lld, %lld) run twice", (long long)rows,
             (long long)n);
    compare_bits(what, got2, got, n);

    dmrt_gpu_free(g, dscratch);
    dmrt_gpu_free(g, dx);
    dmrt_gpu_free(g, ddy);
    dmrt_gpu_free(g, dw);
    dmrt_gpu_free(g, db);
    dmrt_gpu_free(g, dout);
    free(x);
    free(dy);
    free(w);
    free(b);
    free(want);
    free(got);
    free(got2);
}

static void test_layernorm(dmrt_gpu *g) {
    layernorm_case(g, 64, 768, 400);
    layernorm_case(g, 8, 5000, 410);
    layernorm_case(g, 300, 64, 420);    /* wgrad over 2 chunks of rows */
    layernorm_case(g, 3000, 32, 430);   /* wgrad over 12 chunks */
    layernorm_case(g, 5, 3, 440);
}

/* ---- cross-entropy ---------------------------------------------------------------------------- */

static void xent_case(dmrt_gpu *g, int64_t rows, int64_t classes, int64_t mean_rows, int bad) {
    const int64_t total = rows * classes;
    float *logits = host_floats(total), *want = host_floats(total), *got = host_floats(total);
    int32_t *targets = xmalloc((size_t)rows * sizeof(int32_t));
    fill(logits, total, 500 + (uint64_t)classes, -6, 6);
    fill_ids(targets, rows, 510 + (uint64_t)classes, (int32_t)classes);
    if (bad) {
        targets[3] = -1;
        targets[7] = (int32_t)classes;
    }
    float *dl = to_device(g, logits, (size_t)total * sizeof(float));
    int32_t *dt = to_device(g, targets, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, total), *dstats = device_floats(g, rows * 3);
    float *dloss = device_floats(g, 1);
    float *stats = host_floats(rows * 3), *want_stats = host_floats(rows * 3);
    char what[128];

    GPU_OK(g, dmrt_gpu_xent_stats(g, dl, dt, dstats, rows, classes, 5, 0));
    from_device(g, stats, dstats, (size_t)rows * 3 * sizeof(float));
    ref_xent_stats(logits, targets, want_stats, rows, classes);
    snprintf(what, sizeof what, "xent_stats (%lld, %lld)%s", (long long)rows, (long long)classes,
             bad ? " with 2 bad targets" : "");
    /* maxima and target logits exact; double sums in another order, rounded to float */
    compare(what, stats, want_stats, rows * 3, 1e-6, 0, 0);
    const float want_loss = ref_xent(logits, targets, rows, classes, mean_rows);
    float loss = 0, loss2 = 0;
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, mean_rows));
    from_device(g, &loss, dloss, sizeof loss);
    snprintf(what, sizeof what, "cross_entropy (%lld, %lld) / %lld%s", (long long)rows,
             (long long)classes, (long long)mean_rows, bad ? " with 2 bad targets" : "");
    /* double sums in another order, each row's rounded to float: the float loss agrees to
     * its last bits */
    compare(what, &loss, &want_loss, 1, 2e-6, 1e-7, 0);
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, mean_rows));
    from_device(g, &loss2, dloss, sizeof loss2);
    CHECK(memcmp(&loss, &loss2, sizeof loss) == 0, "%s: run twice gave %.9g then %.9g", what,
          (double)loss, (double)loss2);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    if (bad)
        CHECK(f.site == 5 && (f.position == 3 || f.position == 7) &&
                  f.value == targets[f.position],
              "%s: fault site %d value %d position %lld", what, f.site, f.value,
              (long long)f.position);
    else
        CHECK(f.site == 0, "%s: unexpected fault site %d position %lld", what, f.site,
              (long long)f.position);
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 0, "%s: the fault was not cleared by the first take", what);

    /* dloss given as a value, then as a device scalar */
    ref_xent_grad(logits, targets, 1.5f, want, rows, classes, mean_rows);
    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, NULL, 1.5f, dout, rows, classes, 0,
                                          classes, mean_rows));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "cross_entropy_grad (%lld, %lld)%s", (long long)rows,
             (long long)classes, bad ? " with 2 bad targets" : "");
    /* probabilities agree to a float ulp; at the target, p * scale - scale cancels */
    compare(what, got, want, total, 1e-6, 1e-8, 0);
    const float two = 2.0f;
    GPU_OK(g, dmrt_gpu_copy(g, dloss, &two, sizeof two, DMRT_HOST_TO_DEVICE));
    ref_xent_grad(logits, targets, 2.0f, want, rows, classes, mean_rows);
    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, dloss, 0.0f, dout, rows, classes, 0,
                                          classes, mean_rows));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "cross_entropy_grad (%lld, %lld), dloss on the device",
             (long long)rows, (long long)classes);
    compare(what, got, want, total, 1e-6, 1e-8, 0);

    dmrt_gpu_free(g, dl);
    dmrt_gpu_free(g, dt);
    dmrt_gpu_free(g, dout);
    dmrt_gpu_free(g, dstats);
    dmrt_gpu_free(g, dloss);
    free(logits);
    free(want);
    free(got);
    free(stats);
    free(want_stats);
    free(targets);
}

static void test_xent(dmrt_gpu *g) {
    xent_case(g, 16, 50304, 16, 0);
    xent_case(g, 16, 50304, 32, 1);
    xent_case(g, 37, 10, 74, 0);
    xent_case(g, 300, 1000, 300, 1);
}

/* ---- embedding ---------------------------------------------------------------------------------- */

static void embed_case(dmrt_gpu *g, int64_t rows, int64_t cols, int64_t vocab, int64_t n,
                       int64_t first_row, int bad) {
    const int64_t total = rows * cols;
    float *table = host_floats(n * cols), *dy = host_floats(total);
    float *want = host_floats(total > n * cols ? total : n * cols);
    float *got = host_floats(total > n * cols ? total : n * cols), *got2 = host_floats(n * cols);
    int32_t *ids = xmalloc((size_t)rows * sizeof(int32_t));
    fill(table, n * cols, 600, -1, 1);
    fill(dy, total, 610, -1, 1);
    fill_ids(ids, rows, 620 + (uint64_t)rows, (int32_t)vocab);
    if (bad) {
        ids[1] = (int32_t)vocab;
        ids[4] = -3;
    }
    float *dtable = to_device(g, table, (size_t)(n * cols) * sizeof(float));
    float *ddy = to_device(g, dy, (size_t)total * sizeof(float));
    int32_t *dids = to_device(g, ids, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, total > n * cols ? total : n * cols);
    char what[128];

    ref_embed(table, ids, want, rows, n, cols, vocab, first_row);
    GPU_OK(g, dmrt_gpu_embed(g, dtable, dids, dout, rows, n, cols, vocab, first_row, 3, 0));
    from_device(g, got, dout, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "embed %lld ids of %lld, rows [%lld, %lld), %lld cols%s",
             (long long)rows, (long long)vocab, (long long)first_row, (long long)(first_row + n),
             (long long)cols, bad ? ", 2 bad ids" : "");
    compare_bits(what, got, want, total);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    if (bad)
        CHECK(f.site == 3 && (f.position == 1 || f.position == 4) && f.value == ids[f.position],
              "%s: fault site %d value %d position %lld", what, f.site, f.value,
              (long long)f.position);
    else
        CHECK(f.site == 0, "%s: unexpected fault site %d", what, f.site);

    /* the scratch one float past an allocation's start: the kernel aligns it itself */
    const size_t scratch_bytes = dmrt_gpu_embed_grad_scratch(rows);
    void *scratch = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &scratch, scratch_bytes + 4));
    ref_embed_grad(ids, dy, want, rows, n, cols, first_row);
    GPU_OK(g, dmrt_gpu_embed_grad(g, dids, ddy, dout, rows, n, cols, first_row,
                                  (char *)scratch + 4));
    from_device(g, got, dout, (size_t)(n * cols) * sizeof(float));
    snprintf(what, sizeof what, "embed_grad %lld positions into rows [%lld, %lld), %lld cols",
             (long long)rows, (long long)first_row, (long long)(first_row + n), (long long)cols);
    compare_bits(what, got, want, n * cols);
    GPU_OK(g, dmrt_gpu_embed_grad(g, dids, ddy, dout, rows, n, cols, first_row,
                                  (char *)scratch + 4));
    from_device(g, got2, dout, (size_t)(n * cols) * sizeof(float));
    snprintf(what, sizeof what, "embed_grad %lld positions run twice", (long long)rows);
    compare_bits(what, got2, got, n * cols);

    dmrt_gpu_free(g, scratch);
    dmrt_gpu_free(g, dtable);
    dmrt_gpu_free(g, ddy);
    dmrt_gpu_free(g, dids);
    dmrt_gpu_free(g, dout);
    free(table);
    free(dy);
    free(want);
    free(got);
    free(got2);
    free(ids);
}

static void test_embed(dmrt_gpu *g) {
    embed_case(g, 500, 33, 100, 100, 0, 1);      /* whole table, bad ids */
    embed_case(g, 500, 33, 100, 30, 40, 0);      /* a rank's window of rows */
    embed_case(g, 4096, 65, 50, 50, 0, 0);       /* long runs of equal ids */
    embed_case(g, 4096, 65, 50, 20, 10, 1);      /* window + ids outside the vocabulary */
    embed_case(g, 3, 5, 1, 1, 0, 0);             /* a one-row table: 1-bit keys */
    embed_case(g, 20000, 96, 50304, 50304, 0, 0);  /* a GPT-2 vocabulary */
}

/* ---- optimizers ------------------------------------------------------------------------------- */

static void sgd_case(dmrt_gpu *g, float wd, float momentum, float damp, int nesterov) {
    const int64_t n = 10007;
    const float lr = 0.05f;
    float *p = host_floats(n), *grad = host_floats(n), *buf = host_floats(n);
    float *got = host_floats(n);
    fill(p, n, 700, -1, 1);
    float *dp = to_device(g, p, (size_t)n * sizeof(float));
    float *dbuf = momentum != 0.0f ? device_floats(g, n) : NULL;
    float *dg = device_floats(g, n);
    char what[128];
    for (int64_t step = 1; step <= 3; step++) {
        fill(grad, n, 710 + (uint64_t)step, -1, 1);
        GPU_OK(g, dmrt_gpu_copy(g, dg, grad, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        ref_sgd(p, grad, dbuf ? buf : NULL, n, lr, wd, momentum, damp, nesterov, step);
        GPU_OK(g, dmrt_gpu_sgd(g, dp, dg, dbuf, n, lr, wd, momentum, damp, nesterov, step));
    }
    from_device(g, got, dp, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "sgd wd %g momentum %g (1 - dampening) %g nesterov %d, 3 steps",
             (double)wd, (double)momentum, (double)damp, nesterov);
    compare_bits(what, got, p, n);
    if (dbuf) {
        from_device(g, got, dbuf, (size_t)n * sizeof(float));
        compare_bits("  its momentum buffer", got, buf, n);
    }
    dmrt_gpu_free(g, dp);
    dmrt_gpu_free(g, dbuf);
    dmrt_gpu_free(g, dg);
    free(p);
    free(grad);
    free(buf);
    free(got);
}

static void test_adamw(dmrt_gpu *g) {
    const int64_t n = 10007;
    const double lr = 1e-3, wd = 0.1, b1 = 0.9, b2 = 0.999;
    const float eps = 1e-8f;
    float *p = host_floats(n), *grad = host_floats(n), *m = host_floats(n), *v = host_floats(n);
    float *got = host_floats(n);
    fill(p, n, 800, -1, 1);
    float *dp = to_device(g, p, (size_t)n * sizeof(float));
    float *dg = device_floats(g, n), *dm = device_floats(g, n), *dv = device_floats(g, n);
    for (int step = 1; step <= 3; step++) {
        fill(grad, n, 810 + (uint64_t)step, -1, 1);
        GPU_OK(g, dmrt_gpu_copy(g, dg, grad, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        /* the caller's scalars, in double as the C target computes them */
        const float decay = (float)(1.0 - lr * wd);
        const float step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
        const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
        ref_adamw(p, grad, m, v, n, (float)b1, (float)(1.0 - b1), (float)b2, (float)(1.0 - b2),
                  eps, decay, step_size, bc2_sqrt);
        GPU_OK(g, dmrt_gpu_adamw(g, dp, dg, dm, dv, n, (float)b1, (float)(1.0 - b1), (float)b2,
                                 (float)(1.0 - b2), eps, decay, step_size, bc2_sqrt));
    }
    from_device(g, got, dp, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: parameters", got, p, n);
    from_device(g, got, dm, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: first moments", got, m, n);
    from_device(g, got, dv, (size_t)n * sizeof(float));
    compare_bits("adamw, 3 steps: second moments", got, v, n);
    dmrt_gpu_free(g, dp);
    dmrt_gpu_free(g, dg);
    dmrt_gpu_free(g, dm);
    dmrt_gpu_free(g, dv);
    free(p);
    free(grad);
    free(m);
    free(v);
    free(got);
}

static void test_optim(dmrt_gpu *g) {
    sgd_case(g, 0.0f, 0.0f, 1.0f, 0);
    sgd_case(g, 0.01f, 0.9f, 1.0f, 0);
    sgd_case(g, 0.01f, 0.9f, 0.75f, 0);
    sgd_case(g, 0.0f, 0.9f, 1.0f, 1);
    test_adamw(g);
}

/* ---- two thread ranks, staged ------------------------------------------------------------------- */

/* Rank r's i-th input value of a collective: multiples of 1/64, so no sum rounds. */
static float gen(int rank, int64_t i, int salt) {
    return (float)((i * 37 + rank * 101 + salt * 7) % 1000) / 64.0f - 7.0f;
}

/* What every rank of the split cross-entropy needs: whole logits and the answers. */
typedef struct split_data {
    int64_t rows, classes;   /* classes per rank; 2 ranks */
    float *logits;           /* (rows, 2 * classes) */
    int32_t *targets;        /* (rows) */
    float want_loss;
    float *want_grad;        /* (rows, 2 * classes) */
} split_data;

static int rank_fails(dmrt_rank *r, int fails, const char *what) {
    if (fails) printf("FAIL: rank %d: %d failed checks in %s\n", dmrt_rank_id(r), fails, what);
    return fails;
}

static int staged_collectives(dmrt_gpu *g, dmrt_rank *r) {
    dmrt_comm *w = dmrt_rank_world(r);
    const int me = dmrt_rank_id(r);
    const int before = atomic_load(&failures);
    const int64_t n = 1000, total = 2 * n;
    float *h = host_floats(2 * total), *got = host_floats(2 * total), *want = host_floats(2 * total);
    float *d = device_floats(g, 2 * total), *d2 = device_floats(g, 2 * total);
    char what[96];

    for (int started = 0; started < 2; started++) {
        for (int64_t i = 0; i < n; i++) h[i] = gen(me, i, 1);
        for (int64_t i = 0; i < n; i++) want[i] = gen(0, i, 1) + gen(1, i, 1);
        GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        if (started) {
            GPU_OK(g, dmrt_gpu_allreduce_start(g, w, d, n, "started allreduce"));
            GPU_OK(g, dmrt_gpu_comm_wait(g, w));
        } else {
            GPU_OK(g, dmrt_gpu_allreduce_sum(g, w, d, n, "allreduce"));
        }
        from_device(g, got, d, (size_t)n * sizeof(float));
        snprintf(what, sizeof what, "rank %d: staged %sallreduce", me, started ? "started " : "");
        compare_bits(what, got, want, n);
    }
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, w, d, 0, "empty allreduce"));

    /* allgather, out of place and in place */
    for (int in_place = 0; in_place < 2; in_place++) {
        for (int64_t i = 0; i < n; i++) h[i] = gen(me, i, 2);
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < n; i++) want[k * n + i] = gen(k, i, 2);
        float *send = in_place ? d2 + me * n : d;
        GPU_OK(g, dmrt_gpu_copy(g, send, h, (size_t)n * sizeof(float), DMRT_HOST_TO_DEVICE));
        GPU_OK(g, dmrt_gpu_allgather(g, w, send, d2, n, "allgather"));
        from_device(g, got, d2, (size_t)total * sizeof(float));
        snprintf(what, sizeof what, "rank %d: staged allgather%s", me, in_place ? " in place" : "");
        compare_bits(what, got, want, total);
    }

    for (int64_t i = 0; i < total; i++) h[i] = gen(me, i, 3);
    for (int64_t i = 0; i < n; i++) want[i] = gen(0, me * n + i, 3) + gen(1, me * n + i, 3);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)total * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_reduce_scatter_sum(g, w, d, d2, n, "reduce-scatter"));
    from_device(g, got, d2, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged reduce-scatter", me);
    compare_bits(what, got, want, n);

    /* block k of rank me's recv = block me of rank k's send */
    for (int64_t i = 0; i < total; i++) h[i] = gen(me, i, 4);
    for (int k = 0; k < 2; k++)
        for (int64_t i = 0; i < n; i++) want[k * n + i] = gen(k, me * n + i, 4);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)total * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_alltoall(g, w, d, d2, n, "all-to-all"));
    from_device(g, got, d2, (size_t)total * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged all-to-all", me);
    compare_bits(what, got, want, total);

    /* both send first (dmrt_send is buffered), different sizes each way */
    const int peer = 1 - me;
    const int64_t out_n = me == 0 ? 500 : 300, in_n = me == 0 ? 300 : 500;
    for (int64_t i = 0; i < out_n; i++) h[i] = gen(me, i, 5);
    for (int64_t i = 0; i < in_n; i++) want[i] = gen(peer, i, 5);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, (size_t)out_n * sizeof(float), DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_send(g, w, peer, d, out_n, "send"));
    GPU_OK(g, dmrt_gpu_recv(g, w, peer, d2, in_n, "recv"));
    from_device(g, got, d2, (size_t)in_n * sizeof(float));
    snprintf(what, sizeof what, "rank %d: staged send/recv", me);
    compare_bits(what, got, want, in_n);

    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(got);
    free(want);
    return atomic_load(&failures) - before;
}

/* Rank me holds classes [me * classes, (me + 1) * classes) of every row. */
static int split_xent(dmrt_gpu *g, dmrt_rank *r, const split_data *s) {
    dmrt_comm *w = dmrt_rank_world(r);
    const int me = dmrt_rank_id(r);
    const int before = atomic_load(&failures);
    const int64_t rows = s->rows, classes = s->classes, all = 2 * classes;
    float *mine = host_floats(rows * classes), *want = host_floats(rows * classes);
    float *got = host_floats(rows * classes);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t c = 0; c < classes; c++) {
            mine[i * classes + c] = s->logits[i * all + me * classes + c];
            want[i * classes + c] = s->want_grad[i * all + me * classes + c];
        }
    float *dl = to_device(g, mine, (size_t)(rows * classes) * sizeof(float));
    int32_t *dt = to_device(g, s->targets, (size_t)rows * sizeof(int32_t));
    float *dout = device_floats(g, rows * classes), *dloss = device_floats(g, 1);
    float *dstats = device_floats(g, rows * 3);
    float *scratch = device_floats(g, dmrt_gpu_xent_scratch(rows, 2));
    char what[96];

    float loss = 0;
    GPU_OK(g, dmrt_gpu_xent_stats_split(g, w, me, 2, dl, dt, dstats, rows, classes, scratch, 9, 0,
                                        "logits (test)"));
    GPU_OK(g, dmrt_gpu_cross_entropy(g, dstats, dloss, rows, rows));
    from_device(g, &loss, dloss, sizeof loss);
    snprintf(what, sizeof what, "rank %d: split cross_entropy (%lld, 2 x %lld)", me,
             (long long)rows, (long long)classes);
    /* the C target's split sums: float per rank, added over ranks, vs one double sum */
    compare(what, &loss, &s->want_loss, 1, 1e-5, 1e-6, 0);
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_fault_take(g, &f));
    CHECK(f.site == 9 && f.position == 5 && f.value == (int32_t)all,
          "%s: fault site %d value %d position %lld", what, f.site, f.value, (long long)f.position);

    GPU_OK(g, dmrt_gpu_cross_entropy_grad(g, dl, dt, dstats, NULL, 1.0f, dout, rows, classes,
                                          me * classes, 2 * classes, rows));
    from_device(g, got, dout, (size_t)(rows * classes) * sizeof(float));
    snprintf(what, sizeof what, "rank %d: split cross_entropy_grad", me);
    compare(what, got, want, rows * classes, 1e-5, 1e-8, 0);

    dmrt_gpu_free(g, dl);
    dmrt_gpu_free(g, dt);
    dmrt_gpu_free(g, dout);
    dmrt_gpu_free(g, dloss);
    dmrt_gpu_free(g, dstats);
    dmrt_gpu_free(g, scratch);
    free(mine);
    free(want);
    free(got);
    return atomic_load(&failures) - before;
}

static int rank_main(dmrt_rank *r, void *arg) {
    const split_data *s = arg;
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_STAGED, NULL};
    dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
    if (!g) {
        fail("rank %d: dmrt_gpu_create: %s", dmrt_rank_id(r), err);
        dmrt_rank_abort(r, err);
        return 1;
    }
    int fails = rank_fails(r, staged_collectives(g, r), "the staged collectives");
    fails += rank_fails(r, split_xent(g, r, s), "the split cross-entropy");
    dmrt_gpu_destroy(g);
    return fails ? 1 : 0;
}

static void test_ranks(void) {
    split_data s = {.rows = 12, .classes = 500};
    const int64_t all = 2 * s.classes;
    s.logits = host_floats(s.rows * all);
    s.want_grad = host_floats(s.rows * all);
    s.targets = xmalloc((size_t)s.rows * sizeof(int32_t));
    fill(s.logits, s.rows * all, 900, -5, 5);
    fill_ids(s.targets, s.rows, 910, (int32_t)all);
    s.targets[5] = (int32_t)all;  /* outside every rank's classes */
    s.want_loss = ref_xent(s.logits, s.targets, s.rows, all, s.rows);
    ref_xent_grad(s.logits, s.targets, 1.0f, s.want_grad, s.rows, all, s.rows);

    /* both ranks on device 0, as on a one-GPU machine */
    setenv("DMRT_CUDA_DEVICE", "0", 1);
    char err[1024];
    int rc = dmrt_threads_run(2, rank_main, &s, err, sizeof err);
    CHECK(rc == 0, "2 thread ranks: %s", err);
    unsetenv("DMRT_CUDA_DEVICE");
    free(s.logits);
    free(s.want_grad);
    free(s.targets);
}

/* ---- nccl-1rank: NCCL at one rank --------------------------------------------------------------
 *
 * One thread rank on the mesh data=1 with NCCL asked for: the axis gets a one-rank NCCL
 * communicator (AUTO and staged give it none: its collectives are device copies), and
 * every collective on it, and on the world (whose one member is the axis's), runs through
 * NCCL. One rank's sum, gather, scatter and exchange are its own values: exact.
 *
 * A send and recv to oneself do not go through NCCL by design: ncclSend completes only
 * when its receive runs, and dmrt_gpu_send and dmrt_gpu_recv are separate calls that
 * cannot share one NCCL group, so the runtime stages them through dmrt_send (buffered).
 * They are checked for their values. */

/* The values every NCCL check of one comm expects, labelled with the comm's axis. */
static void nccl_check(dmrt_gpu *g, dmrt_comm *c, const char *op, const float *dev,
                       const float *want, float *got, int64_t n) {
    char what[96];
    from_device(g, got, dev, (size_t)n * sizeof(float));
    snprintf(what, sizeof what, "nccl-1rank: %s on %s", op, dmrt_comm_axis_name(c));
    compare_bits(what, got, want, n);
}

static void nccl_one_rank_collectives(dmrt_gpu *g, dmrt_comm *c) {
    const int64_t n = 1000;
    float *h = host_floats(n), *got = host_floats(n);
    float *d = device_floats(g, n), *d2 = device_floats(g, n);
    const size_t bytes = (size_t)n * sizeof(float);
    const char *path = dmrt_gpu_comm_path(g, c);
    CHECK(strcmp(path, "nccl") == 0, "nccl-1rank: collectives on %s take the path \"%s\", not nccl",
          dmrt_comm_axis_name(c), path);

    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 11);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, c, d, n, "allreduce (nccl-1rank)"));
    nccl_check(g, c, "allreduce", d, h, got, n);
    GPU_OK(g, dmrt_gpu_allreduce_sum(g, c, d, 0, "empty allreduce (nccl-1rank)"));

    /* started on the comm stream, then waited for */
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 12);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_allreduce_start(g, c, d, n, "started allreduce (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_comm_wait(g, c));
    nccl_check(g, c, "started allreduce + wait", d, h, got, n);

    /* started, then another call on c before the wait: it runs after the started one */
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 13);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_allreduce_start(g, c, d, n, "started allreduce (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_allgather(g, c, d, d2, n, "allgather after a start (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_comm_wait(g, c));
    nccl_check(g, c, "started allreduce, allgather, wait", d2, h, got, n);

    /* allgather, out of place and in place (send == recv + rank * n) */
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 14);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_allgather(g, c, d, d2, n, "allgather (nccl-1rank)"));
    nccl_check(g, c, "allgather", d2, h, got, n);
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 15);
    GPU_OK(g, dmrt_gpu_copy(g, d2, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_allgather(g, c, d2, d2, n, "allgather in place (nccl-1rank)"));
    nccl_check(g, c, "allgather in place", d2, h, got, n);

    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 16);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_reduce_scatter_sum(g, c, d, d2, n, "reduce-scatter (nccl-1rank)"));
    nccl_check(g, c, "reduce-scatter", d2, h, got, n);

    /* a group of one ncclSend and one ncclRecv, both to this rank */
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 17);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_alltoall(g, c, d, d2, n, "all-to-all (nccl-1rank)"));
    nccl_check(g, c, "all-to-all", d2, h, got, n);

    /* to oneself: staged (see above), buffered, so the send returns before the recv */
    for (int64_t i = 0; i < n; i++) h[i] = gen(0, i, 18);
    GPU_OK(g, dmrt_gpu_copy(g, d, h, bytes, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_zero(g, d2, bytes));
    GPU_OK(g, dmrt_gpu_send(g, c, 0, d, n, "send to self (nccl-1rank)"));
    GPU_OK(g, dmrt_gpu_recv(g, c, 0, d2, n, "recv from self (nccl-1rank)"));
    nccl_check(g, c, "send/recv to self (staged)", d2, h, got, n);

    dmrt_gpu_free(g, d);
    dmrt_gpu_free(g, d2);
    free(h);
    free(got);
}

static int nccl_one_rank_main(dmrt_rank *r, void *arg) {
    (void)arg;
    const int before = atomic_load(&failures);
    char err[512];
    const char *const names[1] = {"data"};
    const int64_t sizes[1] = {1};
    if (dmrt_mesh_init(r, 1, names, sizes, err, sizeof err) != 0) {
        fail("nccl-1rank: dmrt_mesh_init(data=1): %s", err);
        return 1;
    }
    dmrt_comm *data = dmrt_mesh_axis(r, 0), *w = dmrt_rank_world(r);

    /* unchanged without NCCL asked for: AUTO picks NCCL (one rank, one GPU at least) but
     * makes no communicator for an axis of one rank; staged neither */
    const dmrt_gpu_comm_mode modes[2] = {DMRT_GPU_COMM_AUTO, DMRT_GPU_COMM_STAGED};
    const char *const mode_names[2] = {"nccl", "staged"};
    for (int k = 0; k < 2; k++) {
        dmrt_gpu_options opt = {0, modes[k], NULL};
        dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
        if (!g) {
            fail("nccl-1rank: dmrt_gpu_create (%s): %s", mode_names[k], err);
            return 1;
        }
        const char *mode = dmrt_gpu_comm_mode_name(g);
        const char *pd = dmrt_gpu_comm_path(g, data), *pw = dmrt_gpu_comm_path(g, w);
        CHECK(strcmp(mode, mode_names[k]) == 0 && strcmp(pd, "local") == 0 &&
                  strcmp(pw, "local") == 0,
              "nccl-1rank: %s asked: mode %s (want %s), path on data %s, on world %s (want "
              "local)", k ? "staged" : "auto", mode, mode_names[k], pd, pw);
        dmrt_gpu_destroy(g);
    }

    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_NCCL, NULL};
    dmrt_gpu *g = dmrt_gpu_create(r, &opt, err, sizeof err);
    if (!g) {
        fail("nccl-1rank: dmrt_gpu_create (nccl): %s", err);
        return 1;
    }
    printf("nccl-1rank: %s, comm mode %s\n", dmrt_gpu_device_name(g), dmrt_gpu_comm_mode_name(g));
    CHECK(strcmp(dmrt_gpu_comm_mode_name(g), "nccl") == 0, "nccl-1rank: comm mode %s, want nccl",
          dmrt_gpu_comm_mode_name(g));
    nccl_one_rank_collectives(g, data);
    nccl_one_rank_collectives(g, w);
    GPU_OK(g, dmrt_gpu_sync(g));
    dmrt_gpu_destroy(g);
    return atomic_load(&failures) != before;
}

static void test_nccl_one_rank(void) {
    /* the options must decide here: DMRT_GPU_COMM would override them */
    char saved[64] = "";
    const char *env = getenv("DMRT_GPU_COMM");
    const int had = env != NULL;
    if (had) snprintf(saved, sizeof saved, "%s", env);
    unsetenv("DMRT_GPU_COMM");
    char err[1024];
    int rc = dmrt_threads_run(1, nccl_one_rank_main, NULL, err, sizeof err);
    CHECK(rc == 0, "nccl-1rank: 1 thread rank: %s", err);
    if (had) setenv("DMRT_GPU_COMM", saved, 1);
}

int main(void) {
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_AUTO, NULL};
    dmrt_gpu *g = dmrt_gpu_create(NULL, &opt, err, sizeof err);
    if (!g) {
        const char *prefix = "no CUDA device: ";
        if (strncmp(err, prefix, strlen(prefix)) == 0) {
            printf("SKIP: no CUDA device (%s)\n", err + strlen(prefix));
            return 77;
        }
        printf("FAIL: dmrt_gpu_create: %s\n", err);
        return 1;
    }
    test_memory(g);
    test_sgemm(g);
    test_softmax(g);
    test_layernorm(g);
    test_xent(g);
    test_embed(g);
    test_optim(g);
    dmrt_gpu_destroy(g);
    test_ranks();
    test_nccl_one_rank();
    int n = atomic_load(&failures);
    printf("%s: %d failed checks\n", n ? "FAILED" : "passed", n);
    return n ? 1 : 0;
}
