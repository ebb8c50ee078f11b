/* test_gpu_step_end.c: a step without host round trips, on the runtime (a GPU; without one
 * prints SKIP and exits 77):
 *   dmrt_gpu_upload: the caller's buffers may be overwritten as soon as it returns, and
 *     the device gets what they held; an upload outside the reserve is refused;
 *   dmrt_gpu_step_end: the loss and a fault a kernel recorded (a bad cross-entropy
 *     target) read back together, the fault cleared after; a fault of a step abandoned
 *     before its end cleared by the next step's first upload;
 *   dmrt_gpu_adamw and dmrt_gpu_sgd enqueued while the fault is recorded leave the
 *     parameters and their state bit for bit as they were, and update them once it is
 *     cleared (the oracle: the values before, and that they change after);
 *   clipping on the device (dmrt_gpu_clip_*): bit for bit the host path's gradients.
 * Prints FAIL lines and exits 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_cuda.h"

static int failures;

#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            printf("FAIL %d: ", __LINE__);        \
            printf(__VA_ARGS__);                  \
            printf("\n");                         \
            failures++;                           \
        }                                         \
    } while (0)

#define GPU_OK(g, call)                                                                   \
    do {                                                                                  \
        int rc_ = (call);                                                                 \
        if (rc_ != DMRT_OK) {                                                             \
            printf("FAIL %d: %s returned %d: %s\n", __LINE__, #call, rc_, dmrt_gpu_error(g)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

enum { N = 64, ROWS = 4, CLASSES = 8 };

static void *device(dmrt_gpu *g, size_t bytes) {
    void *p = NULL;
    GPU_OK(g, dmrt_gpu_alloc(g, &p, bytes));
    return p;
}

static void test_upload(dmrt_gpu *g, float *dx, int32_t *dy) {
    float x[N], back_x[N];
    int32_t y[ROWS], back_y[ROWS];
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.25f - 3.0f;
    for (int i = 0; i < ROWS; i++) y[i] = i * 3;
    float want_x[N];
    int32_t want_y[ROWS];
    memcpy(want_x, x, sizeof x);
    memcpy(want_y, y, sizeof y);
    GPU_OK(g, dmrt_gpu_upload(g, dx, x, sizeof x, 0));
    GPU_OK(g, dmrt_gpu_upload(g, dy, y, sizeof y, 256));
    memset(x, 0xff, sizeof x); /* the caller reuses its batch at once */
    memset(y, 0xff, sizeof y);
    float loss;
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_step_end(g, NULL, &loss, &f));
    GPU_OK(g, dmrt_gpu_copy(g, back_x, dx, sizeof back_x, DMRT_DEVICE_TO_HOST));
    GPU_OK(g, dmrt_gpu_copy(g, back_y, dy, sizeof back_y, DMRT_DEVICE_TO_HOST));
    CHECK(memcmp(back_x, want_x, sizeof want_x) == 0, "upload: the floats differ");
    CHECK(memcmp(back_y, want_y, sizeof want_y) == 0, "upload: the ints differ");
    CHECK(f.site == 0 && loss == 0.0f, "step_end without a fault or loss: site %d loss %g", f.site, loss);
    CHECK(dmrt_gpu_upload(g, dx, want_x, sizeof want_x, 512) == DMRT_ERR_ARG, "an upload past the reserve must fail");
}

/* the device's state of the update: params, gradient, AdamW's m and v, SGD's momentum */
static void snapshot(dmrt_gpu *g, float *const dev[5], float host[5][N]) {
    for (int k = 0; k < 5; k++) GPU_OK(g, dmrt_gpu_copy(g, host[k], dev[k], N * sizeof(float), DMRT_DEVICE_TO_HOST));
}

static void updates(dmrt_gpu *g, float *const d[5]) {
    GPU_OK(g, dmrt_gpu_adamw(g, d[0], d[1], d[2], d[3], N, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, 0.999f, 0.01f, 0.5f));
    GPU_OK(g, dmrt_gpu_sgd(g, d[0], d[1], d[4], N, 0.1f, 0.01f, 0.9f, 1.0f, 0, 2));
}

static void test_fault_skips_update(dmrt_gpu *g, const int32_t *dy) {
    float init[5][N], before[5][N], after[5][N];
    for (int k = 0; k < 5; k++)
        for (int i = 0; i < N; i++) init[k][i] = 0.01f * (float)((i * 7 + k * 13) % 17) + (k == 3 ? 0.5f : 0.0f);
    float *d[5];
    for (int k = 0; k < 5; k++) {
        d[k] = (float *)device(g, N * sizeof(float));
        GPU_OK(g, dmrt_gpu_copy(g, d[k], init[k], N * sizeof(float), DMRT_HOST_TO_DEVICE));
    }
    /* targets 0, 3, 6, 9: row 3's 9 is outside [0, 8), fault site 5 at position 3 */
    float logits[ROWS * CLASSES];
    for (int i = 0; i < ROWS * CLASSES; i++) logits[i] = 0.1f * (float)(i % 5);
    float *dl = (float *)device(g, sizeof logits), *stats = (float *)device(g, ROWS * 3 * sizeof(float));
    float *dloss = (float *)device(g, sizeof(float));
    const float loss_value = 2.5f;
    GPU_OK(g, dmrt_gpu_copy(g, dl, logits, sizeof logits, DMRT_HOST_TO_DEVICE));
    GPU_OK(g, dmrt_gpu_copy(g, dloss, &loss_value, sizeof loss_value, DMRT_HOST_TO_DEVICE));
    snapshot(g, d, before);
    GPU_OK(g, dmrt_gpu_xent_stats(g, dl, dy, stats, ROWS, CLASSES, 5, 0));
    updates(g, d);
    float loss = 0;
    dmrt_fault f;
    GPU_OK(g, dmrt_gpu_step_end(g, dloss, &loss, &f));
    CHECK(f.site == 5 && f.value == 9 && f.position == 3, "fault site %d value %d position %lld (want 5, 9, 3)", f.site,
          f.value, (long long)f.position);
    CHECK(loss == loss_value, "loss %g, want %g", loss, loss_value);
    snapshot(g, d, after);
    for (int k = 0; k < 5; k++) CHECK(memcmp(before[k], after[k], sizeof before[k]) == 0, "buffer %d changed under a fault", k);
    GPU_OK(g, dmrt_gpu_step_end(g, dloss, &loss, &f));
    CHECK(f.site == 0, "the fault was not cleared by step_end (site %d)", f.site);
    updates(g, d);
    GPU_OK(g, dmrt_gpu_step_end(g, NULL, &loss, &f));
    snapshot(g, d, after);
    CHECK(memcmp(before[0], after[0], sizeof before[0]) != 0, "without a fault the updates changed nothing");
    /* a step abandoned after its fault was recorded (no step_end): the next step's first
     * upload clears the record, so its own end reports no fault and its updates run */
    GPU_OK(g, dmrt_gpu_xent_stats(g, dl, dy, stats, ROWS, CLASSES, 5, 0));
    float x[N] = {0};
    GPU_OK(g, dmrt_gpu_upload(g, d[4], x, sizeof x, 0));
    snapshot(g, d, before);
    updates(g, d);
    GPU_OK(g, dmrt_gpu_step_end(g, NULL, &loss, &f));
    snapshot(g, d, after);
    CHECK(f.site == 0, "an abandoned step's fault outlived the next step's first upload (site %d)", f.site);
    CHECK(memcmp(before[0], after[0], sizeof before[0]) != 0, "after an abandoned step's fault the updates were skipped");
    for (int k = 0; k < 5; k++) dmrt_gpu_free(g, d[k]);
    dmrt_gpu_free(g, dl), dmrt_gpu_free(g, stats), dmrt_gpu_free(g, dloss);
}

/* Clipping on the device (dmrt_gpu_clip_*) against the host's path, as the generated code
 * wrote it before (dmrt_gpu_sum_squares, the factor in float on the host, dmrt_gpu_scale
 * where it is below 1): the same gradients bit for bit, for a clip that scales and one that
 * does not. Three gradients, one of them empty. */
static void test_clip(dmrt_gpu *g) {
    enum { A = 1000, C = 37 };
    const int64_t sizes[3] = {A, 0, C};
    static float host_grad[A + C];
    for (int i = 0; i < A + C; i++) host_grad[i] = 0.001f * (float)((i * 37) % 211) - 0.1f;
    const float clips[2] = {0.05f, 1e6f};
    for (int c = 0; c < 2; c++) {
        float *want = (float *)device(g, (A + C) * sizeof(float)), *got = (float *)device(g, (A + C) * sizeof(float));
        GPU_OK(g, dmrt_gpu_copy(g, want, host_grad, sizeof host_grad, DMRT_HOST_TO_DEVICE));
        GPU_OK(g, dmrt_gpu_copy(g, got, host_grad, sizeof host_grad, DMRT_HOST_TO_DEVICE));
        double sum_squares = 0.0;
        int64_t at = 0;
        for (int k = 0; k < 3; at += sizes[k], k++) GPU_OK(g, dmrt_gpu_sum_squares(g, want + at, sizes[k], &sum_squares));
        const float norm_squared = (float)sum_squares;
        const float clip_scale = clips[c] / (sqrtf(norm_squared) + 1e-6f);
        at = 0;
        for (int k = 0; k < 3; at += sizes[k], k++)
            if (clip_scale < 1.0f) GPU_OK(g, dmrt_gpu_scale(g, want + at, sizes[k], clip_scale));
        at = 0;
        for (int k = 0; k < 3; at += sizes[k], k++) GPU_OK(g, dmrt_gpu_clip_squares(g, got + at, sizes[k], k));
        GPU_OK(g, dmrt_gpu_clip_factor(g, 3, clips[c]));
        at = 0;
        for (int k = 0; k < 3; at += sizes[k], k++) GPU_OK(g, dmrt_gpu_clip_scale(g, got + at, sizes[k]));
        static float w[A + C], d[A + C];
        GPU_OK(g, dmrt_gpu_copy(g, w, want, sizeof w, DMRT_DEVICE_TO_HOST));
        GPU_OK(g, dmrt_gpu_copy(g, d, got, sizeof d, DMRT_DEVICE_TO_HOST));
        CHECK(memcmp(w, d, sizeof w) == 0, "clip %g: the device's clipping differs from the host's", clips[c]);
        CHECK((clip_scale < 1.0f) == (memcmp(d, host_grad, sizeof d) != 0), "clip %g: scaled %d, factor %g", clips[c],
              memcmp(d, host_grad, sizeof d) != 0, clip_scale);
        dmrt_gpu_free(g, want), dmrt_gpu_free(g, got);
    }
}

int main(void) {
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_AUTO, NULL};
    dmrt_gpu *g = dmrt_gpu_create(NULL, &opt, err, sizeof err);
    if (!g) {
        if (strncmp(err, "no CUDA device: ", 16) == 0) {
            printf("SKIP: %s\n", err);
            return 77;
        }
        printf("FAIL: dmrt_gpu_create: %s\n", err);
        return 1;
    }
    GPU_OK(g, dmrt_gpu_upload_reserve(g, 512));
    float *dx = (float *)device(g, N * sizeof(float));
    int32_t *dy = (int32_t *)device(g, ROWS * sizeof(int32_t));
    test_upload(g, dx, dy);
    test_fault_skips_update(g, dy);
    GPU_OK(g, dmrt_gpu_clip_reserve(g, 3));
    test_clip(g);
    dmrt_gpu_free(g, dx), dmrt_gpu_free(g, dy);
    dmrt_gpu_destroy(g);
    printf("%s: %d failed checks\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
