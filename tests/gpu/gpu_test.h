/* gpu_test.h: what the GPU unit tests that use one dmrt_gpu share (test_gpu_quant.c,
 * test_gpu_attention16.c): a call that must succeed, device copies, and the opening that
 * skips (exit 77, meson's skip) without a CUDA device. Static functions: a test includes it
 * once. */
#ifndef DMC_GPU_TEST_H
#define DMC_GPU_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt_cuda.h"

/* A libdmrt_cuda call that must succeed: else the message and exit 1. */
#define GPU_CALL(g, call)                                                                    \
    do {                                                                                     \
        if ((call) != DMRT_OK) {                                                             \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, dmrt_gpu_error(g));    \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

/* A device copy of bytes of host memory (host NULL: zeroed). */
static inline void *on_device(dmrt_gpu *g, const void *host, size_t bytes) {
    void *d = NULL;
    GPU_CALL(g, dmrt_gpu_alloc(g, &d, bytes));
    if (host) GPU_CALL(g, dmrt_gpu_copy(g, d, host, bytes, DMRT_HOST_TO_DEVICE));
    return d;
}

static inline void to_host(dmrt_gpu *g, void *host, const void *dev, size_t bytes) {
    GPU_CALL(g, dmrt_gpu_copy(g, host, dev, bytes, DMRT_DEVICE_TO_HOST));
}

/* The serial program's gpu; without a CUDA device prints SKIP and exits 77. */
static inline dmrt_gpu *gpu_test_open(void) {
    char err[512];
    dmrt_gpu_options opt = {0, DMRT_GPU_COMM_AUTO, NULL};
    dmrt_gpu *g = dmrt_gpu_create(NULL, &opt, err, sizeof err);
    if (!g) {
        int none = strncmp(err, "no CUDA device", 14) == 0;
        printf("%s: %s\n", none ? "SKIP" : "FAIL: dmrt_gpu_create", err);
        exit(none ? 77 : 1);
    }
    return g;
}

#endif
