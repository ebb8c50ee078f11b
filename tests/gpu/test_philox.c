/* test_philox.c: runtime/dmrt_philox.h computes the same bits as C and as CUDA.
 *
 * Built twice by test_philox.sh: as C (cc) and as CUDA (nvcc -x cu, where the header's
 * functions are __host__ __device__; a kernel calling them is compiled too, every warning
 * an error). Each build checks, on the host: Philox4x32-10's known answer at counter and
 * key 0, and dmrt_philox_dropout_keep against an independent spelling of the same key
 * (counter words index lo, index hi, op | 2^31, step; key seed lo, hi; kept when the top
 * 24 bits of the first two words are >= threshold) over many seeds, steps, ops and
 * indices; dmrt_dropout_index (an element's index in the whole tensor, which a CUDA kernel
 * computes per element) against the nested loops the C target counts it in; the bf16 and
 * fp16 roundings of runtime/dmrt_half.h (the cast kernels'); and prints digests of the
 * masks, indices and roundings, which the script requires to be equal between the two
 * builds. No GPU is needed: the device
 * spelling is the same source, compiled for the device. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dmrt_half.h"
#include "dmrt_philox.h"

#ifdef __CUDACC__
/* The device spelling compiles: a kernel drawing one mask element per thread. */
__global__ void dropout_mask_kernel(unsigned char *keep, uint64_t seed, int64_t step, uint32_t op, uint32_t threshold,
                                    int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) keep[i] = (unsigned char)dmrt_philox_dropout_keep(seed, step, op, (uint64_t)i, threshold);
}

/* ... and the 16-bit roundings of a cast kernel (--precision bf16, fp16) */
__global__ void round_kernel(const float *x, uint16_t *bf16, uint16_t *f16, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) bf16[i] = dmrt_bf16_round(x[i]), f16[i] = dmrt_f16_round(x[i]);
}

/* ... and the per-element index a CUDA dropout kernel computes (runtime/cuda/dropout.cu) */
__global__ void dropout_index_kernel(uint64_t *index, dmrt_dropout_shape shape, uint64_t first, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) index[i] = dmrt_dropout_index(&shape, first, i);
}
#endif

/* The index as the C target's generated loops count it (codegen/dialect_c.c, c_dropout):
 * nested loops over the levels, at = at * whole + (offset + i) level by level; checks
 * dmrt_dropout_index at every element, returns the failures. */
static int check_index_loops(const dmrt_dropout_shape *s, uint64_t first, uint64_t *digest) {
    int64_t i[DMRT_DROPOUT_MAX_LEVELS] = {0}, local = 0;
    int failures = 0;
    for (;;) {
        uint64_t at = 0;
        for (int l = 0; l < s->levels; l++) at = (l == 0 ? 0 : at * (uint64_t)s->whole[l]) + (uint64_t)(s->offset[l] + i[l]);
        uint64_t got = dmrt_dropout_index(s, first, local);
        if (got != first + at && failures++ < 5)
            printf("FAIL dropout index of element %lld (%d levels): %llu, the loops count %llu\n", (long long)local, s->levels,
                   (unsigned long long)got, (unsigned long long)(first + at));
        *digest = (*digest ^ got) * 1099511628211ull;
        local++;
        int l = s->levels - 1; /* the next position, innermost level first */
        while (l >= 0 && ++i[l] == s->size[l]) i[l--] = 0;
        if (l < 0) return failures;
    }
}

/* The reference: one round as the paper writes it, with explicit high and low halves. */
static void reference_round(uint32_t c[4], uint32_t k0, uint32_t k1) {
    uint64_t a = (uint64_t)c[0] * 0xD2511F53u, b = (uint64_t)c[2] * 0xCD9E8D57u;
    uint32_t hi_a = (uint32_t)(a >> 32), lo_a = (uint32_t)(a & 0xffffffffu);
    uint32_t hi_b = (uint32_t)(b >> 32), lo_b = (uint32_t)(b & 0xffffffffu);
    uint32_t out[4] = {hi_b ^ c[1] ^ k0, lo_b, hi_a ^ c[3] ^ k1, lo_a};
    for (int i = 0; i < 4; i++) c[i] = out[i];
}

static int reference_keep(uint64_t seed, int64_t step, uint32_t op, uint64_t index, uint32_t threshold) {
    uint32_t c[4] = {(uint32_t)(index & 0xffffffffu), (uint32_t)(index >> 32), op | 0x80000000u,
                     (uint32_t)((uint64_t)step & 0xffffffffu)};
    uint32_t k0 = (uint32_t)(seed & 0xffffffffu), k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) reference_round(c, k0, k1);
    uint32_t top24 = c[1] >> 8; /* bits 40..63 of c[0] | c[1] << 32 */
    return top24 >= threshold;
}

int main(void) {
    int failures = 0;
    /* Philox4x32-10's known answer at counter 0, key 0 (Salmon et al.) */
    static const uint32_t kat[1][8] = {{0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du}};
    static const uint32_t kat_tail[1][2] = {{0xbc57ac4cu, 0x9b00dbd8u}};
    for (int t = 0; t < 1; t++) {
        uint32_t c[4] = {kat[t][0], kat[t][1], kat[t][2], kat[t][3]};
        dmrt_philox4x32_10(c, kat[t][4], kat[t][5]);
        uint32_t want[4] = {kat[t][6], kat[t][7], kat_tail[t][0], kat_tail[t][1]};
        for (int i = 0; i < 4; i++)
            if (c[i] != want[i]) {
                printf("FAIL known answer %d word %d: %08x, expected %08x\n", t, i, (unsigned)c[i], (unsigned)want[i]);
                failures++;
            }
    }
    /* the keep decision against the reference; a digest of every mask bit */
    static const uint64_t seeds[] = {0, 7, 0x123456789abcdefull, ~0ull};
    static const int64_t steps[] = {0, 1, 2, 1000, 0x7fffffffll};
    static const uint32_t thresholds[] = {0, 1677722u, 8388608u, 16777216u};
    uint64_t digest = 1469598103934665603ull, kept = 0, drawn = 0;
    for (int s = 0; s < 4; s++)
        for (int t = 0; t < 5; t++)
            for (uint32_t op = 0; op < 3; op++)
                for (int h = 0; h < 4; h++)
                    for (uint64_t i = 0; i < 2000; i++) {
                        uint64_t index = i + (h == 3 ? 0xfffffff0ull : 0); /* across the index's 32-bit halves */
                        int got = dmrt_philox_dropout_keep(seeds[s], steps[t], op, index, thresholds[h]);
                        int want = reference_keep(seeds[s], steps[t], op, index, thresholds[h]);
                        if (got != want && failures++ < 10)
                            printf("FAIL keep(seed %llu, step %lld, op %u, index %llu, threshold %u) = %d, reference %d\n",
                                   (unsigned long long)seeds[s], (long long)steps[t], (unsigned)op,
                                   (unsigned long long)index, (unsigned)thresholds[h], got, want);
                        digest = (digest ^ (uint64_t)got) * 1099511628211ull;
                        kept += (uint64_t)got, drawn++;
                    }
    printf("%s %llu of %llu kept, digest %016llx\n", failures ? "FAIL" : "ok", (unsigned long long)kept,
           (unsigned long long)drawn, (unsigned long long)digest);
    /* rank blocks: whole, split on the first of two levels, on two levels of four, a
     * micro-batch's first element far into the step */
    static const dmrt_dropout_shape shapes[] = {
        {1, {96}, {96}, {0}},
        {2, {4, 24}, {8, 24}, {4, 0}},
        {4, {2, 3, 2, 5}, {4, 3, 6, 5}, {2, 0, 4, 0}},
        {3, {1, 7, 9}, {3, 14, 9}, {2, 7, 0}},
    };
    uint64_t index_digest = 1469598103934665603ull;
    for (unsigned k = 0; k < sizeof shapes / sizeof *shapes; k++)
        for (int m = 0; m < 2; m++) failures += check_index_loops(&shapes[k], m ? 3ull << 33 : 0, &index_digest);
    printf("%s dropout indices, digest %016llx\n", failures ? "FAIL" : "ok", (unsigned long long)index_digest);
    /* runtime/dmrt_half.h's roundings of every 97th float bit pattern (signs, subnormals,
     * infinities and NaNs among them), round trips exact */
    uint64_t half_digest = 1469598103934665603ull;
    for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 97) {
        uint32_t b = (uint32_t)bits;
        float x;
        memcpy(&x, &b, sizeof x);
        uint16_t h = dmrt_bf16_round(x), f = dmrt_f16_round(x);
        float hx = dmrt_bf16_to_f32(h), fx = dmrt_f16_to_f32(f);
        if (hx == hx && dmrt_bf16_round(hx) != h && failures++ < 10) printf("FAIL bf16 %08x does not round-trip\n", (unsigned)b);
        if (fx == fx && dmrt_f16_round(fx) != f && failures++ < 10) printf("FAIL f16 %08x does not round-trip\n", (unsigned)b);
        half_digest = (half_digest ^ ((uint64_t)h << 16 | f)) * 1099511628211ull;
    }
    printf("%s 16-bit roundings, digest %016llx\n", failures ? "FAIL" : "ok", (unsigned long long)half_digest);
    return failures ? 1 : 0;
}
