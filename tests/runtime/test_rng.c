/* test_rng: Philox known answers, determinism, counter addressing, moments. */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

int main(void) {
    int fails = 0;
    dmrt_rng a, b;

    /* Philox4x32-10 known answer (Random123 kat_vectors): counter 0, key 0 gives
     * 6627e8d5 e169c58d bc57ac4c 9b00dbd8; we return the first two words. */
    dmrt_rng_init(&a, 0, 0);
    uint64_t v = dmrt_rng_u64(&a);
    CHECK(v == UINT64_C(0xe169c58d6627e8d5), "philox(0, 0) = %016llx", (unsigned long long)v);
    /* counter all ones, key all ones: 408f276d 41c83b0e ... */
    dmrt_rng_init(&a, UINT64_MAX, UINT64_MAX);
    a.counter = UINT64_MAX;
    v = dmrt_rng_u64(&a);
    CHECK(v == UINT64_C(0x41c83b0e408f276d), "philox(~0, ~0) = %016llx", (unsigned long long)v);

    /* same (seed, stream): same sequence; other stream or seed: another */
    dmrt_rng_init(&a, 1234, 7);
    dmrt_rng_init(&b, 1234, 7);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= dmrt_rng_u64(&a) == dmrt_rng_u64(&b);
    CHECK(same, "equal seeds diverge");
    dmrt_rng_init(&a, 1234, 7);
    dmrt_rng_init(&b, 1234, 8);
    CHECK(dmrt_rng_u64(&a) != dmrt_rng_u64(&b), "streams 7 and 8 agree");
    dmrt_rng_init(&a, 1234, 7);
    dmrt_rng_init(&b, 1235, 7);
    CHECK(dmrt_rng_u64(&a) != dmrt_rng_u64(&b), "seeds 1234 and 1235 agree");

    /* the value at index i does not depend on what was drawn before */
    dmrt_rng_init(&a, 99, 3);
    float seq[10];
    for (int i = 0; i < 10; i++) seq[i] = i % 2 ? dmrt_rng_normal(&a) : dmrt_rng_uniform(&a);
    dmrt_rng_init(&b, 99, 3);
    b.counter = 7;
    CHECK(dmrt_rng_normal(&b) == seq[7], "normal at counter 7 differs");
    b.counter = 4;
    CHECK(dmrt_rng_uniform(&b) == seq[4], "uniform at counter 4 differs");

    /* moments of 1e6 normals and uniforms */
    enum { N = 1000000 };
    float *x = malloc(N * sizeof(float));
    dmrt_rng_init(&a, 2024, 0);
    dmrt_fill_normal(x, N, 0.0f, 1.0f, &a);
    double s = 0, s2 = 0;
    int finite = 1;
    for (int i = 0; i < N; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        finite &= isfinite(x[i]) != 0;
    }
    double mean = s / N, sd = sqrt(s2 / N - mean * mean);
    CHECK(finite, "non-finite normal");
    CHECK(fabs(mean) < 0.005, "normal mean %g", mean);
    CHECK(fabs(sd - 1.0) < 0.005, "normal std %g", sd);
    dmrt_fill_normal(x, N, 3.0f, 0.5f, &a);
    s = 0;
    for (int i = 0; i < N; i++) s += x[i];
    CHECK(fabs(s / N - 3.0) < 0.005, "normal(3, 0.5) mean %g", s / N);

    dmrt_fill_uniform(x, N, -2.0f, 3.0f, &a);
    s = 0;
    int in_range = 1;
    for (int i = 0; i < N; i++) {
        s += x[i];
        in_range &= x[i] >= -2.0f && x[i] < 3.0f;
    }
    CHECK(in_range, "uniform outside [-2, 3)");
    CHECK(fabs(s / N - 0.5) < 0.01, "uniform(-2, 3) mean %g", s / N);

    dmrt_fill_const(x, 5, 2.5f);
    CHECK(x[0] == 2.5f && x[4] == 2.5f, "fill_const");
    free(x);

    /* aligned, zeroed allocation */
    unsigned char *p = dmrt_alloc(100);
    CHECK(p && (uintptr_t)p % 64 == 0, "dmrt_alloc not 64-byte aligned");
    int zero = 1;
    for (int i = 0; p && i < 100; i++) zero &= p[i] == 0;
    CHECK(zero, "dmrt_alloc not zeroed");
    dmrt_free(p);
    double t0 = dmrt_now(), t1 = dmrt_now();
    CHECK(t1 >= t0 && t0 > 0, "dmrt_now not monotonic");

    if (fails) fprintf(stderr, "test_rng: %d failures\n", fails);
    return fails != 0;
}
