/* dmrt_half.h: the 16-bit float formats (bf16, IEEE binary16) as inline conversions that C
 * (libdmrt, the C target's generated loops) and CUDA (the CUDA target's cast kernels)
 * compile alike: under nvcc they are __host__ __device__, so both targets round every value
 * to the same bits (tests/gpu/test_philox.c checks the two builds agree). The generated code
 * holds 16-bit tensors as uint16_t arrays of these bits. */
#ifndef DMRT_HALF_H
#define DMRT_HALF_H

#include <stdint.h>
#include <string.h>

#include "dmrt_host_device.h"

/* bf16 is the upper half of an IEEE binary32: the same exponent range, 8 bits of
 * significand. The generated code holds bf16 tensors as uint16_t arrays of these bits.
 * dmrt_bf16_round rounds to nearest, ties to even (a float just under the largest finite
 * bf16's half-way point stays finite, from there on it becomes inf, as IEEE rounding
 * does); infinities stay infinities, a NaN stays a NaN of the same sign, made quiet (the
 * carry of rounding could otherwise turn a NaN whose payload sits in the low bits into
 * inf). Subnormals round like any other value: nothing is flushed to zero. */
static inline DMRT_HOST_DEVICE uint16_t dmrt_bf16_round(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    /* adding 0x7fff rounds the lower half up past half-way; the kept half's last bit
     * breaks the tie toward the even one */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
/* Exact: every bf16 is a float. */
static inline DMRT_HOST_DEVICE float dmrt_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}
/* IEEE binary16 bits of x, rounded to nearest, ties to even: past 65504 (from 65520 on) inf,
 * below 2^-14 the subnormals (steps of 2^-24), a NaN stays a quiet NaN of its sign. */
static inline DMRT_HOST_DEVICE uint16_t dmrt_f16_round(float x) {
    uint32_t bits, magnitude;
    memcpy(&bits, &x, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
    if (magnitude >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520: half-way to 65536 */
    if (magnitude >= 0x38800000u) { /* 2^-14 and up: a normal half */
        magnitude += 0x0fffu + ((magnitude >> 13) & 1u);
        return (uint16_t)(sign | ((magnitude - 0x38000000u) >> 13)); /* exponent rebiased, 127 - 15 */
    }
    /* a subnormal half: |x| + 0.5 has steps of 2^-24, so the FPU's own rounding (to nearest
     * even) leaves the count of 2^-24 in its low bits; 2^-14 itself comes out as 0x0400 */
    float absolute, shifted;
    memcpy(&absolute, &magnitude, sizeof absolute);
    shifted = absolute + 0.5f;
    memcpy(&bits, &shifted, sizeof bits);
    return (uint16_t)(sign | (bits - 0x3f000000u));
}
/* Exact: every half is a float. */
static inline DMRT_HOST_DEVICE float dmrt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    float x;
    if (exponent == 0) {
        x = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &x, sizeof bits);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    memcpy(&x, &bits, sizeof x);
    return x;
}

#endif
