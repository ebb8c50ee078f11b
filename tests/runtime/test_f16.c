/* test_f16: the fp16 conversions (dmrt.h, "fp16 products") and dmrt_gemm_f16.
 * Oracles: every one of the 65536 halves decoded by the IEEE formula in double and
 * rounded back to itself; for floats, the nearest-half property checked against the two
 * neighbouring halves (ties to the even one) over every float exponent; the product against
 * a double product of the decoded halves. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

/* The value of half h by the IEEE 754 formula. */
static double half_value(uint16_t h) {
    int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    double magnitude = exponent == 0 ? ldexp(mantissa, -24)
                       : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                        : ldexp(1024 + mantissa, exponent - 25);
    return h & 0x8000 ? -magnitude : magnitude;
}

static int check_every_half(void) {
    int fails = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        double want = half_value((uint16_t)h);
        float got = dmrt_f16_to_f32((uint16_t)h);
        if (isnan(want)) {
            CHECK(isnan(got), "half 0x%04x is a NaN, decoded %g", h, got);
            uint16_t back = dmrt_f16_round(got);
            CHECK((back & 0x7e00) == 0x7e00 && (back & 0x8000) == (h & 0x8000), "NaN 0x%04x came back as 0x%04x", h, back);
            continue;
        }
        CHECK((double)got == want, "half 0x%04x decoded %.9g, IEEE %.9g", h, got, want);
        CHECK(dmrt_f16_round(got) == h || (h == 0x8000 && dmrt_f16_round(got) == 0x8000),
              "half 0x%04x does not round back to itself: 0x%04x", h, dmrt_f16_round(got));
    }
    return fails;
}

/* x rounds to the nearest half, ties to the even one; past 65520 to inf. */
static int check_nearest(float x) {
    int fails = 0;
    uint16_t h = dmrt_f16_round(x);
    double got = half_value(h), ax = fabs((double)x);
    if (ax >= 65520.0) {
        CHECK(isinf(got) && (got < 0) == (x < 0), "%.9g rounded to 0x%04x, not inf", x, h);
        return fails;
    }
    CHECK(!isinf(got), "%.9g rounded to inf", x);
    double err = fabs(got - (double)x);
    uint16_t mag = h & 0x7fff;
    for (int step = -1; step <= 1; step += 2) {
        if ((mag == 0 && step < 0) || mag + step >= 0x7c00) continue;
        uint16_t other = (uint16_t)((h & 0x8000) | (mag + step));
        double other_err = fabs(half_value(other) - (double)x);
        CHECK(err < other_err || (err == other_err && (h & 1) == 0),
              "%.9g rounded to 0x%04x (error %.3g) but 0x%04x is nearer or the even tie (%.3g)", x, h, err, other,
              other_err);
    }
    return fails;
}

static int check_floats(void) {
    int fails = 0;
    static const float exact[] = {0.0f, 1.0f, -2.0f, 65504.0f, 0x1p-14f, 0x1p-24f, 0x1.ff8p-15f};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        CHECK(dmrt_f16_to_f32(dmrt_f16_round(exact[i])) == exact[i], "%a is a half but does not survive", exact[i]);
    CHECK(dmrt_f16_round(65519.0f) == 0x7bff, "65519 is under the half-way point to 65536: 65504");
    CHECK(dmrt_f16_round(65520.0f) == 0x7c00, "65520 ties to the even 65536, which is inf");
    CHECK(dmrt_f16_round(0x1p-25f) == 0x0000, "2^-25 ties to the even 0");
    CHECK(dmrt_f16_round(0x1.8p-24f) == 0x0002, "1.5 * 2^-24 ties to the even 2 * 2^-24");
    CHECK(dmrt_f16_round(-INFINITY) == 0xfc00, "-inf");
    uint64_t state = 12345;
    for (int i = 0; i < 200000; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(state >> 32);
        /* every exponent from 2^-30 to 2^17, a random significand and sign; ties too */
        bits = (bits & 0x807fffffu) | ((uint32_t)(97 + (state >> 20) % 48) << 23);
        if (i % 4 == 0) bits &= ~0x00000fffu, bits |= 0x00001000u; /* exactly half-way at 2^-10 steps */
        float x;
        memcpy(&x, &bits, sizeof x);
        fails += check_nearest(x);
        if (fails > 10) break;
    }
    return fails;
}

static int check_product(void) {
    int fails = 0;
    enum { M = 17, N = 33, K = 65 };
    uint16_t a[M * K], b[N * K];
    float c[M * N];
    for (int i = 0; i < M * K; i++) a[i] = dmrt_f16_round((float)((i * 37 % 101) - 50) / 17.0f);
    for (int i = 0; i < N * K; i++) b[i] = dmrt_f16_round((float)((i * 53 % 89) - 44) / 13.0f);
    for (int split = 0; split < 2; split++) {
        for (int i = 0; i < M * N; i++) c[i] = 1.0f; /* beta 1: added to */
        if (split) dmrt_gemm_f16_split(2, 0, 1, M, N, K, 1.0f, a, K, b, K, 1.0f, c, N);
        else dmrt_gemm_f16(0, 1, M, N, K, 1.0f, a, K, b, K, 1.0f, c, N);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double want = 1.0, scale = 1.0;
                for (int p = 0; p < K; p++) {
                    double t = half_value(a[i * K + p]) * half_value(b[j * K + p]);
                    want += t, scale += fabs(t);
                }
                CHECK(fabs(c[i * N + j] - want) <= K * 0x1p-23 * scale, "split %d: c[%d][%d] %.9g, want %.9g", split, i, j,
                      c[i * N + j], want);
            }
    }
    return fails;
}

int main(void) {
    int fails = check_every_half() + check_floats() + check_product();
    if (fails) {
        fprintf(stderr, "%d check(s) failed\n", fails);
        return 1;
    }
    printf("fp16: 65536 halves round-trip, 200000 floats round to the nearest half, products as in double\n");
    return 0;
}
