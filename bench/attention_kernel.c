/* attention_kernel: one layer's causal attention, the fused kernels of
 * runtime/dmrt_attention.h against the unfused ops the C target generates without them
 * (--no-fuse-attention): per head a product of q and kT into T x T scores, the softmax
 * with its scale and the mask fused (keys after the query skipped), the product with v;
 * backward the two products of the output's gradient, the softmax's gradient and the two
 * products giving dq and dk. Compiled as generated code is (-O3 -march=native
 * -fno-math-errno), its loops written as dialect_c.c writes them; the fused kernels are
 * libdmrt's set for those flags (dmrt_attention.h), printed.
 *
 * usage: attention_kernel [HEADS [T [D [REPS [OPERANDS]]]]]   (default 64 256 32 20 f32: the mid
 *        GPT of bench/gpt_step.py, B x NH = 8 x 8)
 * OPERANDS: f32, or bf16: the fused kernel's tile products on operands rounded to bf16
 * (--precision bf16; with the avx512bf16 set, vdpbf16ps products:
 * runtime/dmrt_attention_tiles.h); the unfused side stays f32, so the results' distance
 * is then the rounding's.
 * Prints the best of REPS of each side, forward and backward, and how far apart their
 * results are. OPENBLAS_NUM_THREADS sets the unfused products' threads (the fused
 * kernel's tile products are below BLAS's threshold for threads). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dmrt.h"
#include "dmrt_attention.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The sum of x[0 .. n), in the generated code's 8 lanes. */
static float lanes_sum(const float *x, const float *y, int64_t n) {
    float lanes[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int lane = 0; lane < 8; lane++) lanes[lane] += x[j + lane] * (y ? y[j + lane] : 1.0f);
    for (; j < n; j++) lanes[0] += x[j] * (y ? y[j] : 1.0f);
    return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

typedef struct layer {
    int64_t heads, T, D;
    float scale;
    float *q, *k, *v, *dout;       /* (heads, T, D) */
    float *scores, *probs, *dprobs, *dscores; /* (heads, T, T): the unfused ops' buffers */
    float *out, *lse, *grads;      /* fused: (heads, T, D), (heads, T), 3 x (heads, T, D) */
    float *out_unfused, *grads_unfused, *work;
} layer;

static void unfused_forward(layer *L) {
    const int64_t T = L->T, D = L->D;
    for (int64_t h = 0; h < L->heads; h++)
        dmrt_sgemm(0, 1, T, T, D, 1.0f, L->q + h * T * D, D, L->k + h * T * D, D, 0.0f, L->scores + h * T * T, T);
    for (int64_t r = 0; r < L->heads * T; r++) {
        const int64_t keys = r % T + 1;
        const float *row = L->scores + r * T;
        float *out_row = L->probs + r * T;
        float max = row[0];
        for (int64_t j = 1; j < keys; j++) max = row[j] > max ? row[j] : max;
        const float scaled_max = max * L->scale;
        for (int64_t j = 0; j < keys; j++) out_row[j] = expf(row[j] * L->scale - scaled_max);
        const float inv_sum = 1.0f / lanes_sum(out_row, NULL, keys);
        for (int64_t j = 0; j < keys; j++) out_row[j] *= inv_sum;
        for (int64_t j = keys; j < T; j++) out_row[j] = 0.0f;
    }
    for (int64_t h = 0; h < L->heads; h++)
        dmrt_sgemm(0, 0, T, D, T, 1.0f, L->probs + h * T * T, T, L->v + h * T * D, D, 0.0f, L->out_unfused + h * T * D, D);
}

static void unfused_backward(layer *L) {
    const int64_t T = L->T, D = L->D, n = L->heads * T * D;
    float *dq = L->grads_unfused, *dk = dq + n, *dv = dk + n;
    for (int64_t h = 0; h < L->heads; h++) {
        dmrt_sgemm(0, 1, T, T, D, 1.0f, L->dout + h * T * D, D, L->v + h * T * D, D, 0.0f, L->dprobs + h * T * T, T);
        dmrt_sgemm(1, 0, T, D, T, 1.0f, L->probs + h * T * T, T, L->dout + h * T * D, D, 0.0f, dv + h * T * D, D);
    }
    for (int64_t r = 0; r < L->heads * T; r++) {
        const int64_t keys = r % T + 1;
        const float *y_row = L->probs + r * T, *dy_row = L->dprobs + r * T;
        float *out_row = L->dscores + r * T;
        const float dot = lanes_sum(y_row, dy_row, keys);
        for (int64_t j = 0; j < keys; j++) out_row[j] = L->scale * (y_row[j] * (dy_row[j] - dot));
        for (int64_t j = keys; j < T; j++) out_row[j] = 0.0f;
    }
    for (int64_t h = 0; h < L->heads; h++) {
        dmrt_sgemm(0, 0, T, D, T, 1.0f, L->dscores + h * T * T, T, L->k + h * T * D, D, 0.0f, dq + h * T * D, D);
        dmrt_sgemm(1, 0, T, D, T, 1.0f, L->dscores + h * T * T, T, L->q + h * T * D, D, 0.0f, dk + h * T * D, D);
    }
}

static double max_apart(const float *a, const float *b, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static float *floats(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) {
        fprintf(stderr, "attention_kernel: out of memory\n");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv) {
    layer L = {.heads = argc > 1 ? atol(argv[1]) : 64, .T = argc > 2 ? atol(argv[2]) : 256, .D = argc > 3 ? atol(argv[3]) : 32};
    int reps = argc > 4 ? atoi(argv[4]) : 20;
    const char *type = argc > 5 ? argv[5] : "f32";
    int operands = !strcmp(type, "f32") ? DMRT_ATTENTION_F32 : !strcmp(type, "bf16") ? DMRT_ATTENTION_BF16 : -1;
    if (L.heads < 1 || L.T < 1 || L.D < 1 || reps < 1 || operands < 0) {
        fprintf(stderr, "usage: attention_kernel [HEADS [T [D [REPS [f32|bf16]]]]]\n");
        return 2;
    }
    const int64_t n = L.heads * L.T * L.D, nn = L.heads * L.T * L.T;
    L.scale = 1.0f / sqrtf((float)L.D);
    L.q = floats(n), L.k = floats(n), L.v = floats(n), L.dout = floats(n);
    L.scores = floats(nn), L.probs = floats(nn), L.dprobs = floats(nn), L.dscores = floats(nn);
    L.out = floats(n), L.lse = floats(L.heads * L.T), L.grads = floats(3 * n);
    L.out_unfused = floats(n), L.grads_unfused = floats(3 * n), L.work = floats(dmrt_attention_work_floats_of(operands, L.T, L.D));
    dmrt_rng rng;
    dmrt_rng_init(&rng, 1, 0);
    dmrt_fill_uniform(L.q, n, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(L.k, n, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(L.v, n, -1.0f, 1.0f, &rng);
    dmrt_fill_uniform(L.dout, n, -1.0f, 1.0f, &rng);
    double best[4] = {INFINITY, INFINITY, INFINITY, INFINITY};
    for (int r = 0; r < reps; r++) {
        double t[5];
        t[0] = now();
        dmrt_attention_forward(L.q, L.k, L.v, L.out, L.lse, L.heads, 1, L.T, L.D, L.scale, 1, operands, 1, L.work);
        t[1] = now();
        unfused_forward(&L);
        t[2] = now();
        dmrt_attention_backward(L.q, L.k, L.v, L.out, L.lse, L.dout, L.grads, L.grads + n, L.grads + 2 * n, L.heads, 1,
                                L.T, L.D, L.scale, 1, operands, 1, L.work);
        t[3] = now();
        unfused_backward(&L);
        t[4] = now();
        for (int i = 0; i < 4; i++) best[i] = fmin(best[i], t[i + 1] - t[i]);
    }
    printf("heads %lld, T %lld, D %lld, causal, %s operands, kernels %s, best of %d: forward fused %.2f ms, unfused %.2f ms; backward fused "
           "%.2f ms, unfused %.2f ms; results apart: out %.2g, dq dk dv %.2g\n",
           (long long)L.heads, (long long)L.T, (long long)L.D, type,
           DMRT_ATTENTION_ISA_NAME, reps, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3,
           best[3] * 1e3, max_apart(L.out, L.out_unfused, n), max_apart(L.grads, L.grads_unfused, 3 * n));
    float *buffers[] = {L.q, L.k, L.v, L.dout, L.scores, L.probs, L.dprobs, L.dscores, L.out, L.lse, L.grads,
                        L.out_unfused, L.grads_unfused, L.work};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; i++) free(buffers[i]);
    return 0;
}
