/* rng.c: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11), used as a counter-based generator.
 *
 * Draw number `counter` of stream `stream` under key `seed` is one Philox block:
 *   counter words (counter lo, counter hi, stream lo, stream hi), key (seed lo, seed hi);
 * the first two output words form the u64. Every draw (u64, uniform, normal) consumes
 * exactly one block, so value i of a stream can be had by setting rng->counter = i. */
#include "dmrt.h"
#include "dmrt_philox.h"

#include <math.h>

/* Philox itself is dmrt_philox.h's, shared with CUDA kernels (dropout's masks). */

void dmrt_rng_init(dmrt_rng *rng, uint64_t seed, uint64_t stream) {
    rng->seed = seed;
    rng->stream = stream;
    rng->counter = 0;
}

uint64_t dmrt_rng_u64(dmrt_rng *rng) {
    uint32_t x[4] = {(uint32_t)rng->counter, (uint32_t)(rng->counter >> 32),
                     (uint32_t)rng->stream, (uint32_t)(rng->stream >> 32)};
    dmrt_philox4x32_10(x, (uint32_t)rng->seed, (uint32_t)(rng->seed >> 32));
    rng->counter++;
    return (uint64_t)x[0] | (uint64_t)x[1] << 32;
}

float dmrt_rng_uniform(dmrt_rng *rng) {
    /* 24 random bits: every value is exactly representable and < 1. */
    return (float)(dmrt_rng_u64(rng) >> 40) * 0x1.0p-24f;
}

float dmrt_rng_normal(dmrt_rng *rng) {
    /* Box-Muller on the two halves of one draw; u1 in (0, 1] so log(u1) is finite. */
    uint64_t u = dmrt_rng_u64(rng);
    double u1 = ((double)(u >> 32) + 1.0) * 0x1.0p-32;
    double u2 = (double)(u & 0xffffffffu) * 0x1.0p-32;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2));
}

void dmrt_fill_uniform(float *p, int64_t n, float lo, float hi, dmrt_rng *rng) {
    for (int64_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * dmrt_rng_uniform(rng);
        if (v >= hi && hi > lo) v = nextafterf(hi, lo); /* rounding; keep [lo, hi) */
        p[i] = v;
    }
}

void dmrt_fill_normal(float *p, int64_t n, float mean, float std, dmrt_rng *rng) {
    for (int64_t i = 0; i < n; i++) p[i] = mean + std * dmrt_rng_normal(rng);
}

void dmrt_fill_const(float *p, int64_t n, float value) {
    for (int64_t i = 0; i < n; i++) p[i] = value;
}

/* Dropout's mask (codegen/emit_dropout.c): element `index` of the whole tensor, in dropout
 * number `op` of the program at step `step`, under `seed`, is one Philox block with counter
 * words (index lo, index hi, op with its top bit set, step) and key (seed lo, seed hi): the
 * top bit keeps these blocks apart from the parameters' streams (dmrt_rng_init). Kept when
 * its 24-bit uniform, as dmrt_rng_uniform's, is at least threshold / 2^24 (ceil(p 2^24)). */
int dmrt_dropout_keep(uint64_t seed, int64_t step, uint32_t op, uint64_t index, uint32_t threshold) {
    return dmrt_philox_dropout_keep(seed, step, op, index, threshold);
}
