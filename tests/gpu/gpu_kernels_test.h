/* gpu_kernels_test.h: what the gpu-kernels test's files share (test_gpu_kernels.c: the
 * kernels on one device and main; gpu_kernels_refs.c: the helpers and the plain C
 * references of the C target's kernels; gpu_kernels_ranks.c: the collectives on thread
 * ranks and NCCL at one rank). */
#ifndef DMC_GPU_KERNELS_TEST_H
#define DMC_GPU_KERNELS_TEST_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "dmrt.h"
#include "dmrt_cuda.h"

/* failed checks so far, over every thread rank */
extern atomic_int test_failures;

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

/* One printf per line: the two thread ranks report at the same time. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *xmalloc(size_t bytes);
float *host_floats(int64_t n);
void fill(float *p, int64_t n, uint64_t seed, float lo, float hi);
void fill_ids(int32_t *ids, int64_t n, uint64_t seed, int32_t below);
void *to_device(dmrt_gpu *g, const void *host, size_t bytes);
float *device_floats(dmrt_gpu *g, int64_t n);
void from_device(dmrt_gpu *g, void *host, const void *dev, size_t bytes);
/* Every element within atol + rtol * |want|; where want is exactly 0 (keys a causal mask
 * hid), got must be exactly 0 too when zeros_exact. */
void compare(const char *what, const float *got, const float *want, int64_t n, double rtol, double atol,
             int zeros_exact);
/* The same bits (NaN payloads aside, none here). */
void compare_bits(const char *what, const float *got, const float *want, int64_t n);
void ref_softmax(const float *x, float *out, int64_t outer, int64_t n, int64_t inner, float scale, int64_t cq);
void ref_softmax_grad(const float *y, const float *dy, float *out, int64_t outer, int64_t n, int64_t inner, float scale,
                      int64_t cq);
void ref_causal_mask(const float *x, float *out, int64_t outer, int64_t nq, int64_t nk, float fill_value);
/* Layernorm's double sums one after another here; dialect_c_rows.c adds them in 8 double lanes
 * (vectorised), which rounds to the same mean and rstd but for the rare row near a float
 * boundary: far inside the tolerances the layernorm cases compare with. */
void ref_ln_stats(const float *x, int64_t n, float eps, float *mean, float *rstd);
void ref_layernorm(const float *x, const float *w, const float *b, float *out, int64_t rows, int64_t n, float eps);
void ref_layernorm_grad(const float *x, const float *w, const float *dy, float *out, int64_t rows, int64_t n,
                        float eps);
void ref_layernorm_wgrad(const float *x, const float *dy, float *out, int64_t rows, int64_t n, float eps);
/* Rows whose target is outside [0, classes) add nothing (the GPU records a fault). */
float ref_xent(const float *logits, const int32_t *targets, int64_t rows, int64_t classes, int64_t mean_rows);
/* The sum as the statistics store it (a float); rows whose target is out of range get
 * zeros (the GPU records a fault). */
void ref_xent_grad(const float *logits, const int32_t *targets, float dloss, float *out, int64_t rows, int64_t classes,
                   int64_t mean_rows);
/* stats (rows, 3): max, sum of exp(logit - max) as a float, the target's logit; a row with
 * a bad target (0, 1, 0). */
void ref_xent_stats(const float *logits, const int32_t *targets, float *stats, int64_t rows, int64_t classes);
void ref_embed(const float *table, const int32_t *ids, float *out, int64_t rows, int64_t n, int64_t cols, int64_t vocab,
               int64_t first_row);
void ref_embed_grad(const int32_t *ids, const float *dy, float *out, int64_t rows, int64_t n, int64_t cols,
                    int64_t first_row);
void ref_sgd(float *p, const float *g, float *buf, int64_t n, float lr, float wd, float mom, float damp, int nesterov,
             int64_t step);
void ref_adamw(float *p, const float *g, float *m, float *v, int64_t n, float b1, float b1c, float b2, float b2c,
               float eps, float decay, float step_size, float bc2_sqrt);

/* the collectives on two thread ranks sharing device 0, staged (with the split
 * cross-entropy), and NCCL at one rank (gpu_kernels_ranks.c) */
void test_ranks(void);
void test_nccl_one_rank(void);
/* dmrt_gpu_gemm_epilogue's bias and bias gradient, both paths (gpu_kernels_epilogue.c) */
void test_gemm_epilogue(dmrt_gpu *g);

#endif
