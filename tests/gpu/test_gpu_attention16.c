/* test_gpu_attention16.c: the 16-bit fused attention through cuDNN (runtime/cuda/attention16.cu)
 * against f32 attention (runtime/dmrt_attention_rows.h, the CUDA target's f32 kernels run
 * here on the host) on the same 16-bit-rounded q, k, v and dout: out, lse, dq, dk and dv for
 * bf16 and fp16, causal and not, on odd and round shapes. The bound is the 16-bit type's:
 * cuDNN rounds out, dq, dk, dv and the probabilities it multiplies to the 16-bit type
 * (about 2^-8 relative for bf16, 2^-11 for fp16), so results must agree within
 * BOUND x the largest magnitude of the reference; lse is f32 from the same inputs (1e-3).
 * Grouped-query attention's _grouped calls, 16-bit and the f32 kernel, against the same
 * reference on k and v repeated (grouped_case). The _inner calls (the heads side by side in
 * a row, as a fused gpt.dm attention has them), f32 and 16-bit, against the same reference
 * on the inputs relaid (inner_case).
 * Run with DMRT_CUDNN_ATTENTION=require, so a shape cuDNN makes no plan for fails rather
 * than running the f32 kernel; then =off (the 16-bit calls run the f32 kernel, the _inner
 * ones too, within the 16-bit bound), auto on a
 * head width cuDNN does not take (the same) and a bad value (mode_cases).
 * Also: a scratch too small for the shape fails with a message naming the attention. Without a CUDA device prints SKIP
 * and exits 77 (meson: skipped). Never run on a GPU when written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt_attention_rows.h"
#include "dmrt_cuda.h"
#include "dmrt_half.h"
#include "gpu_test.h"

static int failures;

/* A call of the attention under test: a failure (cuDNN making no plan for a shape, say) is
 * printed and counted, and the case goes on to its cleanup, so that one shape cuDNN
 * refuses does not hide the others' results. */
#define ATTENTION_CALL(g, call, label)                                                        \
    do {                                                                                      \
        if ((call) != DMRT_OK) {                                                              \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, dmrt_gpu_error(g));     \
            failures++;                                                                       \
            goto label;                                                                       \
        }                                                                                     \
    } while (0)

static float *floats(int64_t n) {
    float *p = calloc((size_t)n, sizeof(float));
    if (!p) exit(1);
    return p;
}

/* uniform in [-1, 1), rounded to the 16-bit type (both sides then read the same values) */
static void fill16(float *x, int64_t n, unsigned seed, int half) {
    srand(seed);
    for (int64_t i = 0; i < n; i++) {
        float u = 2.0f * (float)rand() / ((float)RAND_MAX + 1.0f) - 1.0f;
        x[i] = half ? dmrt_f16_to_f32(dmrt_f16_round(u)) : dmrt_bf16_to_f32(dmrt_bf16_round(u));
    }
}

static void compare(const char *what, const float *got, const float *want, int64_t n, double bound, int relative) {
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    /* a NaN difference is the worst of all (fmax would skip it, and a NaN result pass) */
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        worst = d == d ? fmax(worst, d) : INFINITY;
    }
    double limit = relative ? bound * scale : bound;
    printf("%-34s max |difference| %.2e (bound %.2e)\n", what, worst, limit);
    if (!(worst <= limit)) failures++;
}

static float *to_device(dmrt_gpu *g, const float *h, int64_t n) { return on_device(g, h, (size_t)n * sizeof(float)); }

/* the f32 reference over every head: out, lse, dq, dk, dv */
static void reference(const float *q, const float *k, const float *v, const float *dout, float *out, float *lse,
                      float *dq, float *dk, float *dv, int64_t heads, int64_t t, int64_t d, float scale, int causal) {
    for (int64_t h = 0; h < heads; h++) {
        int64_t o = h * t * d;
        for (int64_t r = 0; r < t; r++)
            dmrt_attention_row_forward(q + o, k + o, v + o, out + o, lse + h * t, r, t, d, 1, scale, causal);
        for (int64_t r = 0; r < t; r++) {
            dmrt_attention_row_dq(q + o, k + o, v + o, out + o, lse + h * t, dout + o, dq + o, r, t, d, 1, scale,
                                  causal);
            dmrt_attention_row_dkdv_grouped(q + o, k + o, v + o, out + o, lse + h * t, dout + o, dk + o, dv + o, r, 1,
                                            t, d, 1, scale, causal);
        }
    }
}

/* via_cudnn 0: DMRT_CUDNN_ATTENTION=off, so the 16-bit calls run the f32 kernel: within
 * its bound (grouped_case's kind 2), and a scratch of 256 bytes is enough. */
static void attention_case(dmrt_gpu *g, int half, int64_t heads, int64_t t, int64_t d, int causal, int via_cudnn) {
    const int64_t n = heads * t * d;
    const float scale = 1.0f / sqrtf((float)d), bound = !via_cudnn ? 1e-5f : half ? 4e-3f : 3e-2f;
    float *h[5], *want[6], *got[6];
    for (int i = 0; i < 5; i++) h[i] = floats(n), fill16(h[i], n, 17u + (unsigned)i, half);
    for (int i = 0; i < 6; i++) want[i] = floats(n), got[i] = floats(n);
    /* the reference's dout is the 16-bit dout; its out the f32 one (cuDNN's reads its own) */
    reference(h[0], h[1], h[2], h[3], want[0], want[1], want[2], want[3], want[4], heads, t, d, scale, causal);
    float *dev_q = to_device(g, h[0], n), *dev_k = to_device(g, h[1], n), *dev_v = to_device(g, h[2], n);
    float *dev_dout = to_device(g, h[3], n), *dev_out = to_device(g, NULL, n), *dev_lse = to_device(g, NULL, heads * t);
    float *gq = to_device(g, NULL, n), *gk = to_device(g, NULL, n), *gv = to_device(g, NULL, n);
    int64_t work_bytes = dmrt_cuda_attention16_scratch_bytes(heads, t, d, 1);
    void *work = to_device(g, NULL, (work_bytes + 3) / 4);
    ATTENTION_CALL(g,
                   dmrt_gpu_attention16_forward(g, half, dev_q, dev_k, dev_v, dev_out, dev_lse, heads, t, d, scale,
                                                causal, work, work_bytes, "test.attention"),
                   done);
    ATTENTION_CALL(g,
                   dmrt_gpu_attention16_backward(g, half, dev_q, dev_k, dev_v, dev_out, dev_lse, dev_dout, gq, gk, gv,
                                                 heads, t, d, scale, causal, work, work_bytes, "test.attention"),
                   done);
    ATTENTION_CALL(g, dmrt_gpu_sync(g), done);
    to_host(g, got[0], dev_out, (size_t)n * 4), to_host(g, got[1], dev_lse, (size_t)(heads * t) * 4);
    to_host(g, got[2], gq, (size_t)n * 4), to_host(g, got[3], gk, (size_t)n * 4), to_host(g, got[4], gv, (size_t)n * 4);
    char what[96];
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "%s %lldx(%lld,%lld)%s %s%s", half ? "fp16" : "bf16", (long long)heads,
                 (long long)t, (long long)d, causal ? " causal" : "", names[i], via_cudnn ? "" : " (cuDNN off)");
        compare(what, got[i], want[i], i == 1 ? heads * t : n, i == 1 ? 1e-3 : bound, i != 1);
    }
    /* too little scratch: a message naming the attention (the f32 kernel needs none) */
    int rc = dmrt_gpu_attention16_backward(g, half, dev_q, dev_k, dev_v, dev_out, dev_lse, dev_dout, gq, gk, gv, heads,
                                           t, d, scale, causal, work, 256, "test.small");
    if (via_cudnn ? rc == DMRT_OK || !strstr(dmrt_gpu_error(g), "test.small") : rc != DMRT_OK) {
        printf("FAIL: 256 bytes of scratch%s: rc %d, '%s'\n", via_cudnn ? "" : " (cuDNN off)", rc,
               dmrt_gpu_error(g));
        failures++;
    }
done:;
    float *all[] = {dev_q, dev_k, dev_v, dev_dout, dev_out, dev_lse, gq, gk, gv, work};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dmrt_gpu_free(g, all[i]);
    for (int i = 0; i < 5; i++) free(h[i]);
    for (int i = 0; i < 6; i++) free(want[i]), free(got[i]);
}

/* Grouped-query attention (k, v with heads / group heads): the _grouped calls, f32 (kind
 * 2: attention.cu, within 1e-5 of the largest magnitude: out, lse and dq are the row
 * functions' arithmetic but for nvcc's fused multiply-adds, dk and dv one running sum over
 * the group where the reference adds the heads' sums) and 16-bit (kind 0 bf16, 1 fp16,
 * within the 16-bit bound), against the plain f32 reference on k and v repeated, dk and dv
 * summed over each group. */
static void grouped_case(dmrt_gpu *g, int kind, int64_t heads, int64_t group, int64_t t, int64_t d, int causal) {
    const int64_t n = heads * t * d, kv_n = n / group, head = t * d;
    const float scale = 1.0f / sqrtf((float)d), bound = kind == 2 ? 1e-5f : kind ? 4e-3f : 3e-2f;
    float *q = floats(n), *kv = floats(2 * kv_n), *rep = floats(2 * n), *dout = floats(n), *want[5], *got[5];
    fill16(q, n, 31u, kind == 1), fill16(kv, 2 * kv_n, 32u, kind == 1), fill16(dout, n, 33u, kind == 1);
    for (int64_t part = 0; part < 2; part++)
        for (int64_t h = 0; h < heads; h++)
            memcpy(rep + part * n + h * head, kv + part * kv_n + h / group * head, sizeof(float) * (size_t)head);
    const int64_t count[5] = {n, heads * t, n, kv_n, kv_n};
    for (int i = 0; i < 5; i++) want[i] = floats(n), got[i] = floats(n);
    float *rep_dk = floats(n), *rep_dv = floats(n);
    reference(q, rep, rep + n, dout, want[0], want[1], want[2], rep_dk, rep_dv, heads, t, d, scale, causal);
    for (int64_t i = 0; i < kv_n; i++)
        for (int64_t r = 0; r < group; r++) {
            const int64_t at = (i / head * group + r) * head + i % head;
            want[3][i] += rep_dk[at], want[4][i] += rep_dv[at];
        }
    float *dev_q = to_device(g, q, n), *dev_k = to_device(g, kv, kv_n), *dev_v = to_device(g, kv + kv_n, kv_n);
    float *dev_dout = to_device(g, dout, n), *dev_out = to_device(g, NULL, n), *dev_lse = to_device(g, NULL, heads * t);
    float *gq = to_device(g, NULL, n), *gk = to_device(g, NULL, kv_n), *gv = to_device(g, NULL, kv_n);
    int64_t work_bytes = dmrt_cuda_attention16_scratch_bytes(heads, t, d, 1);
    void *work = to_device(g, NULL, (work_bytes + 3) / 4);
    if (kind == 2) {
        ATTENTION_CALL(g,
                       dmrt_gpu_attention_forward_grouped(g, dev_q, dev_k, dev_v, dev_out, dev_lse, heads, group, t, d,
                                                          scale, causal),
                       done);
        ATTENTION_CALL(g,
                       dmrt_gpu_attention_backward_grouped(g, dev_q, dev_k, dev_v, dev_out, dev_lse, dev_dout, gq, gk,
                                                           gv, heads, group, t, d, scale, causal),
                       done);
    } else {
        ATTENTION_CALL(g,
                       dmrt_gpu_attention16_forward_grouped(g, kind, dev_q, dev_k, dev_v, dev_out, dev_lse, heads,
                                                            group, t, d, scale, causal, work, work_bytes,
                                                            "test.grouped"),
                       done);
        ATTENTION_CALL(g,
                       dmrt_gpu_attention16_backward_grouped(g, kind, dev_q, dev_k, dev_v, dev_out, dev_lse, dev_dout,
                                                             gq, gk, gv, heads, group, t, d, scale, causal, work,
                                                             work_bytes, "test.grouped"),
                       done);
    }
    ATTENTION_CALL(g, dmrt_gpu_sync(g), done);
    float *dev[5] = {dev_out, dev_lse, gq, gk, gv};
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"}, *kinds[3] = {"bf16", "fp16", "f32"};
    char what[96];
    for (int i = 0; i < 5; i++) {
        to_host(g, got[i], dev[i], (size_t)count[i] * 4);
        snprintf(what, sizeof what, "%s %lldx(%lld,%lld)/%lld%s %s", kinds[kind], (long long)heads, (long long)t,
                 (long long)d, (long long)group, causal ? " causal" : "", names[i]);
        compare(what, got[i], want[i], count[i], i == 1 && kind != 2 ? 1e-3 : bound, i != 1 || kind == 2);
    }
done:;
    float *all[] = {dev_q, dev_k, dev_v, dev_dout, dev_out, dev_lse, gq, gk, gv, work};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dmrt_gpu_free(g, all[i]);
    free(q), free(kv), free(rep), free(dout), free(rep_dk), free(rep_dv);
    for (int i = 0; i < 5; i++) free(want[i]), free(got[i]);
}

/* x (heads one after the other, heads of `head` = positions x width elements) relaid with
 * `inner` heads side by side in a row (to_inner), or back: the layout of a fused gpt.dm
 * attention's [B, T, H, D] operands (lse: width 1). */
static void relay(const float *x, float *y, int64_t n, int64_t inner, int64_t positions, int64_t width, int to_inner) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t at = dmrt_attention_inner_index(i, inner, positions, width);
        if (to_inner) y[at] = x[i];
        else y[i] = x[at];
    }
}

/* The heads side by side (the _inner calls, what gpt.dm's fused attention runs): f32 (kind 2,
 * attention.cu) and 16-bit (kind 0 bf16, 1 fp16) on the inputs relaid, their results relaid
 * back, against the plain reference, within attention_case's and grouped_case's bounds. */
static void inner_case(dmrt_gpu *g, int kind, int64_t heads, int64_t inner, int64_t t, int64_t d, int causal) {
    const int64_t n = heads * t * d, rows = heads * t;
    const float scale = 1.0f / sqrtf((float)d), bound = kind == 2 ? 1e-5f : kind ? 4e-3f : 3e-2f;
    float *in[4], *side[4], *want[5], *got[5], *dev_in[4], *dev[5];
    for (int i = 0; i < 4; i++) {
        in[i] = floats(n), side[i] = floats(n);
        fill16(in[i], n, 41u + (unsigned)i, kind == 1);
        relay(in[i], side[i], n, inner, t, d, 1);
    }
    for (int i = 0; i < 5; i++) want[i] = floats(n), got[i] = floats(n);
    reference(in[0], in[1], in[2], in[3], want[0], want[1], want[2], want[3], want[4], heads, t, d, scale, causal);
    for (int i = 0; i < 4; i++) dev_in[i] = to_device(g, side[i], n);
    dev[0] = to_device(g, NULL, n), dev[1] = to_device(g, NULL, rows);
    for (int i = 2; i < 5; i++) dev[i] = to_device(g, NULL, n);
    int64_t work_bytes = dmrt_cuda_attention16_scratch_bytes(heads, t, d, 1);
    void *work = to_device(g, NULL, (work_bytes + 3) / 4);
    if (kind == 2) {
        ATTENTION_CALL(g,
                       dmrt_gpu_attention_forward_inner(g, dev_in[0], dev_in[1], dev_in[2], dev[0], dev[1], heads,
                                                        inner, t, d, scale, causal),
                       done);
        ATTENTION_CALL(g,
                       dmrt_gpu_attention_backward_inner(g, dev_in[0], dev_in[1], dev_in[2], dev[0], dev[1], dev_in[3],
                                                         dev[2], dev[3], dev[4], heads, inner, t, d, scale, causal),
                       done);
    } else {
        ATTENTION_CALL(g,
                       dmrt_gpu_attention16_forward_inner(g, kind, dev_in[0], dev_in[1], dev_in[2], dev[0], dev[1],
                                                          heads, inner, t, d, scale, causal, work, work_bytes,
                                                          "test.inner"),
                       done);
        ATTENTION_CALL(g,
                       dmrt_gpu_attention16_backward_inner(g, kind, dev_in[0], dev_in[1], dev_in[2], dev[0], dev[1],
                                                           dev_in[3], dev[2], dev[3], dev[4], heads, inner, t, d,
                                                           scale, causal, work, work_bytes, "test.inner"),
                       done);
    }
    ATTENTION_CALL(g, dmrt_gpu_sync(g), done);
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"}, *kinds[3] = {"bf16", "fp16", "f32"};
    char what[96];
    for (int i = 0; i < 5; i++) {
        const int64_t count = i == 1 ? rows : n;
        to_host(g, side[0], dev[i], (size_t)count * 4);
        relay(side[0], got[i], count, inner, t, i == 1 ? 1 : d, 0);
        snprintf(what, sizeof what, "%s %lldx(%lld,%lld) %lld side by side%s %s", kinds[kind], (long long)heads,
                 (long long)t, (long long)d, (long long)inner, causal ? " causal" : "", names[i]);
        compare(what, got[i], want[i], count, i == 1 && kind != 2 ? 1e-3 : bound, i != 1 || kind == 2);
    }
done:;
    for (int i = 0; i < 4; i++) dmrt_gpu_free(g, dev_in[i]), free(in[i]), free(side[i]);
    for (int i = 0; i < 5; i++) dmrt_gpu_free(g, dev[i]), free(want[i]), free(got[i]);
    dmrt_gpu_free(g, work);
}

/* DMRT_CUDNN_ATTENTION, read when a context's first attention runs: off routes the 16-bit
 * calls to the f32 kernel; auto does for a shape cuDNN's flash attention does not take
 * (head width 12, refused before any graph, as cudnn-frontend refuses it), its backward
 * then finding the shape's entry made planless by the forward; a bad value fails naming
 * it. */
static void mode_cases(void) {
    setenv("DMRT_CUDNN_ATTENTION", "off", 1);
    dmrt_gpu *g = gpu_test_open();
    attention_case(g, 0, 6, 40, 64, 1, 0);
    inner_case(g, 0, 8, 4, 40, 64, 1); /* the 16-bit _inner calls on the f32 _inner kernel */
    dmrt_gpu_destroy(g);
    setenv("DMRT_CUDNN_ATTENTION", "auto", 1);
    g = gpu_test_open();
    attention_case(g, 1, 6, 40, 12, 1, 0);
    dmrt_gpu_destroy(g);
    setenv("DMRT_CUDNN_ATTENTION", "bogus", 1);
    g = gpu_test_open();
    float *x = to_device(g, NULL, 64);
    int rc = dmrt_gpu_attention16_forward(g, 0, x, x, x, x, x, 1, 8, 8, 1.0f, 1, x, 256, "test.mode");
    if (rc == DMRT_OK || !strstr(dmrt_gpu_error(g), "DMRT_CUDNN_ATTENTION=bogus")) {
        printf("FAIL: DMRT_CUDNN_ATTENTION=bogus: rc %d, '%s'\n", rc, dmrt_gpu_error(g));
        failures++;
    }
    dmrt_gpu_free(g, x);
    dmrt_gpu_destroy(g);
}

int main(void) {
    /* a shape cuDNN makes no plan for fails here rather than running the f32 kernel */
    setenv("DMRT_CUDNN_ATTENTION", "require", 1);
    dmrt_gpu *g = gpu_test_open();
    for (int half = 0; half < 2; half++)
        for (int causal = 0; causal < 2; causal++) {
            /* the widest heads first: the shapes cuDNN's engines most surely take */
            attention_case(g, half, 4, 128, 64, causal, 1);
            attention_case(g, half, 6, 40, 64, causal, 1); /* positions not a multiple of 64 */
            attention_case(g, half, 16, 16, 8, causal, 1); /* gpt.dm's tiny heads */
        }
    for (int kind = 0; kind < 3; kind++)
        for (int causal = 0; causal < 2; causal++) {
            grouped_case(g, kind, 8, 8, 128, 64, causal); /* one kv head (multi-query) */
            grouped_case(g, kind, 6, 3, 40, 64, causal);
            grouped_case(g, kind, 16, 2, 16, 8, causal); /* llama.dm's tiny heads, NKV = NH / 2 */
            inner_case(g, kind, 12, 12, 64, 64, causal); /* GPT-2's 12 heads of 64, B = 1 */
            inner_case(g, kind, 8, 4, 40, 64, causal);   /* B = 2 of 4 heads */
            inner_case(g, kind, 16, 4, 16, 8, causal);   /* gpt.dm's tiny heads */
        }
    dmrt_gpu_destroy(g);
    mode_cases();
    printf(failures ? "%d failures\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
