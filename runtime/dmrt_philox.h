/* dmrt_philox.h: Philox4x32-10 (Salmon et al., SC'11) and dropout's keep decision as inline
 * functions that C (runtime/rng.c, libdmrt) and CUDA compile alike: under nvcc they are
 * __host__ __device__, so a GPU kernel draws the very bits the C target draws. One source
 * for both; rng.c's dmrt_dropout_keep is dmrt_philox_dropout_keep. */
#ifndef DMRT_PHILOX_H
#define DMRT_PHILOX_H

#include <stdint.h>

#include "dmrt_host_device.h"

/* Ten rounds on the counter ctr under the key (key0, key1), in place. */
static inline DMRT_HOST_DEVICE void dmrt_philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0], p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ key0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ key1;
        uint32_t n3 = (uint32_t)p0;
        ctr[0] = n0, ctr[1] = n1, ctr[2] = n2, ctr[3] = n3;
        key0 += 0x9E3779B9u;
        key1 += 0xBB67AE85u;
    }
}

/* Dropout's mask: element `index` of the whole tensor, in dropout number `op` of the
 * program at step `step`, under `seed`, is one Philox block with counter words (index lo,
 * index hi, op with its top bit set, step) and key (seed lo, seed hi): the top bit keeps
 * these blocks apart from the parameters' streams (dmrt_rng_init). Kept (1) when its 24-bit
 * uniform is at least threshold / 2^24 (threshold = ceil(p 2^24)). */
static inline DMRT_HOST_DEVICE int dmrt_philox_dropout_keep(uint64_t seed, int64_t step, uint32_t op, uint64_t index,
                                                            uint32_t threshold) {
    uint32_t x[4] = {(uint32_t)index, (uint32_t)(index >> 32), op | 0x80000000u, (uint32_t)step};
    dmrt_philox4x32_10(x, (uint32_t)seed, (uint32_t)(seed >> 32));
    uint64_t u = (uint64_t)x[0] | (uint64_t)x[1] << 32;
    return (uint32_t)(u >> 40) >= threshold;
}

/* Where a rank's dropout element sits in the whole tensor. Its block is walked as `levels`
 * nested loops (the dims up to the last split one, then the rest as one): level l runs
 * size[l] positions of this rank's block, starting at offset[l] of the whole's whole[l]
 * (coordinate x size on a split level, else 0). Element `local` of the block (row-major
 * over the levels) is element `first + at` of the step's whole tensor, at the mixed-radix
 * number of its global positions; `first` is the micro-batch's first element. The C
 * target's generated loops count `at` level by level, a CUDA kernel computes it per
 * element here: the same number, so both draw the same mask. */
#define DMRT_DROPOUT_MAX_LEVELS 8
typedef struct dmrt_dropout_shape {
    int levels;
    int64_t size[DMRT_DROPOUT_MAX_LEVELS];   /* (levels) */
    int64_t whole[DMRT_DROPOUT_MAX_LEVELS];  /* (levels) */
    int64_t offset[DMRT_DROPOUT_MAX_LEVELS]; /* (levels) */
} dmrt_dropout_shape;

static inline DMRT_HOST_DEVICE uint64_t dmrt_dropout_index(const dmrt_dropout_shape *s, uint64_t first, int64_t local) {
    uint64_t at = 0, radix = 1;
    for (int l = s->levels - 1; l >= 0; l--) {
        int64_t i = local % s->size[l];
        local /= s->size[l];
        at += (uint64_t)(s->offset[l] + i) * radix;
        radix *= (uint64_t)s->whole[l];
    }
    return first + at;
}

#endif
