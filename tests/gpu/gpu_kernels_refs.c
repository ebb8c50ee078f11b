/* gpu_kernels_refs.c: the gpu-kernels test's helpers (failures, host and device buffers,
 * comparisons) and its plain C references of the C target's kernels
 * (codegen/dialect_c.c, dialect_c_rows.c). */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "gpu_kernels_test.h"

atomic_int test_failures;

/* One printf per line: the two thread ranks report at the same time. */
void fail(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    printf("FAIL: %s\n", line);
    fflush(stdout);
    atomic_fetch_add(&test_failures, 1);
}

/* ---- helpers ------------------------------------------------------------------------------ */

void *xmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        printf("FAIL: out of host memory\n");
        exit(1);
    }
    return p;
}

float *host_floats(int64_t n) { return xmalloc((size_t)n * sizeof(float)); }

void fill(float *p, int64_t n, uint64_t seed, float lo, float hi) {
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, 7);
    dmrt_fill_uniform(p, n, lo, hi, &rng);
}

void fill_ids(int32_t *ids, int64_t n, uint64_t seed, int32_t below) {
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, 11);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(dmrt_rng_u64(&rng) % (uint64_t)below);
}

void *to_device(dmrt_gpu *g, const void *host, size_t bytes) {
    void *d = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &d, bytes));
    if (bytes) GPU_OK(g, dmrt_gpu_copy(g, d, host, bytes, DMRT_HOST_TO_DEVICE));
    return d;
}

float *device_floats(dmrt_gpu *g, int64_t n) {
    void *d = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &d, (size_t)n * sizeof(float)));
    return d;
}

void from_device(dmrt_gpu *g, void *host, const void *dev, size_t bytes) {
    GPU_OK(g, dmrt_gpu_copy(g, host, dev, bytes, DMRT_DEVICE_TO_HOST));
}

/* Every element within atol + rtol * |want|; where want is exactly 0 (keys a causal mask
 * hid), got must be exactly 0 too when zeros_exact. */
void compare(const char *what, const float *got, const float *want, int64_t n,
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
void compare_bits(const char *what, const float *got, const float *want, int64_t n) {
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

void ref_softmax(const float *x, float *out, int64_t outer, int64_t n, int64_t inner,
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

void ref_softmax_grad(const float *y, const float *dy, float *out, int64_t outer,
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

void ref_causal_mask(const float *x, float *out, int64_t outer, int64_t nq, int64_t nk,
                            float fill_value) {
    for (int64_t r = 0; r < outer; r++)
        for (int64_t q = 0; q < nq; q++)
            for (int64_t k = 0; k < nk; k++)
                out[(r * nq + q) * nk + k] = k > q + (nk - nq) ? fill_value : x[(r * nq + q) * nk + k];
}

/* Layernorm's double sums one after another here; dialect_c_rows.c adds them in 8 double lanes
 * (vectorised), which rounds to the same mean and rstd but for the rare row near a float
 * boundary: far inside the tolerances the layernorm cases compare with. */
void ref_ln_stats(const float *x, int64_t n, float eps, float *mean, float *rstd) {
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t j = 0; j < n; j++) sum += x[j];
    const float m = (float)(sum / (double)n);
    for (int64_t j = 0; j < n; j++) sum_sq += (double)(x[j] - m) * (x[j] - m);
    *mean = m;
    *rstd = (float)(1.0 / sqrt(sum_sq / (double)n + eps));
}

void ref_layernorm(const float *x, const float *w, const float *b, float *out,
                          int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float mean, rstd;
        ref_ln_stats(x + r * n, n, eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++) out[r * n + j] = (x[r * n + j] - mean) * rstd * w[j] + b[j];
    }
}

void ref_layernorm_grad(const float *x, const float *w, const float *dy, float *out,
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

void ref_layernorm_wgrad(const float *x, const float *dy, float *out, int64_t rows,
                                int64_t n, float eps) {
    memset(out, 0, (size_t)n * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        float mean, rstd;
        ref_ln_stats(x + r * n, n, eps, &mean, &rstd);
        for (int64_t j = 0; j < n; j++) out[j] += dy[r * n + j] * ((x[r * n + j] - mean) * rstd);
    }
}

/* Rows whose target is outside [0, classes) add nothing (the GPU records a fault). */
float ref_xent(const float *logits, const int32_t *targets, int64_t rows,
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
void ref_xent_grad(const float *logits, const int32_t *targets, float dloss, float *out,
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
void ref_xent_stats(const float *logits, const int32_t *targets, float *stats,
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

void ref_embed(const float *table, const int32_t *ids, float *out, int64_t rows,
                      int64_t n, int64_t cols, int64_t vocab, int64_t first_row) {
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = (int64_t)ids[r] - first_row;
        const int ok = ids[r] >= 0 && ids[r] < vocab && row >= 0 && row < n;
        for (int64_t j = 0; j < cols; j++) out[r * cols + j] = ok ? table[row * cols + j] : 0.0f;
    }
}

void ref_embed_grad(const int32_t *ids, const float *dy, float *out, int64_t rows,
                           int64_t n, int64_t cols, int64_t first_row) {
    memset(out, 0, (size_t)(n * cols) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = (int64_t)ids[r] - first_row;
        if (row < 0 || row >= n) continue;
        for (int64_t j = 0; j < cols; j++) out[row * cols + j] += dy[r * cols + j];
    }
}

void ref_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float wd,
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

void ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float b1,
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
