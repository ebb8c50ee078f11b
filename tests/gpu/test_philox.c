/* test_philox.c: runtime/dmrt_philox.h computes the same bits as C and as CUDA.
 *
 * Built twice by test_philox.sh: as C (cc) and as CUDA (nvcc -x cu, where the header's
 * functions are __host__ __device__; a kernel calling them is compiled too, every warning
 * an error). Each build checks, on the host: Philox4x32-10's known answer at counter and
 * key 0, and dmrt_philox_dropout_keep against an independent spelling of the same key
 * (counter words index lo, index hi, op | 2^31, step; key seed lo, hi; kept when the top
 * 24 bits of the first two words are >= threshold) over many seeds, steps, ops and
 * indices; and prints a digest of the masks, which the script requires to be equal
 * between the two builds. No GPU is needed: the device
 * spelling is the same source, compiled for the device. */
#include <stdint.h>
#include <stdio.h>

#include "dmrt_philox.h"

#ifdef __CUDACC__
/* The device spelling compiles: a kernel drawing one mask element per thread. */
__global__ void dropout_mask_kernel(unsigned char *keep, uint64_t seed, int64_t step, uint32_t op, uint32_t threshold,
                                    int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) keep[i] = (unsigned char)dmrt_philox_dropout_keep(seed, step, op, (uint64_t)i, threshold);
}
#endif

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
    return failures ? 1 : 0;
}
