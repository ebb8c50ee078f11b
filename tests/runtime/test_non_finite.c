/* test_non_finite: dmrt_first_non_finite (runtime/params_io.c), which the trainer asks of
 * every gradient after every step, against the plain search (isfinite element by element):
 * NaN, +inf and -inf at the first, last and block-boundary places and at random ones, two at
 * once (the first is found), none, the largest finite floats and subnormals (finite), on
 * lengths around its block of 1024 floats. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "dmrt.h"

int64_t dmrt_first_non_finite(const void *x, int64_t n); /* runtime/internal.h */

static int64_t plain(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

int main(void) {
    int fails = 0, cases = 0;
    const int64_t lengths[] = {0, 1, 2, 1023, 1024, 1025, 2048, 5000, 100003};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    float *x = malloc(100003 * sizeof(float));
    char *unaligned = malloc(100003 * sizeof(float) + 1);
    if (!x || !unaligned) return 1;
    srand(7);
    for (size_t l = 0; l < sizeof lengths / sizeof *lengths; l++) {
        const int64_t n = lengths[l];
        for (int64_t i = 0; i < n; i++) {
            /* finite edge values among ordinary ones: FLT_MAX, subnormals, zeros */
            int r = rand() % 16;
            x[i] = r == 0 ? 3.4028235e38f : r == 1 ? -1e-45f : r == 2 ? -0.0f : (float)(rand() - RAND_MAX / 2) * 1e-3f;
        }
        CHECK(dmrt_first_non_finite(x, n) == -1, "n %lld, all finite: found %lld", (long long)n,
              (long long)dmrt_first_non_finite(x, n));
        cases++;
        int64_t places[8] = {0, n - 1, 1023, 1024, 2047, n / 2, n > 0 ? rand() % n : 0, n > 0 ? rand() % n : 0};
        for (int p = 0; p < 8; p++) {
            if (places[p] < 0 || places[p] >= n) continue;
            for (size_t b = 0; b < sizeof bad / sizeof *bad; b++) {
                const float saved = x[places[p]];
                x[places[p]] = bad[b];
                /* a second one later: the first must be the one found */
                const int64_t later = places[p] + 1 + (n - places[p] > 1 ? rand() % (n - places[p] - 1) : 0);
                float saved_later = 0.0f;
                if (later < n) saved_later = x[later], x[later] = bad[(b + 1) % 4];
                int64_t want = plain(x, n), got = dmrt_first_non_finite(x, n);
                CHECK(got == want && want == places[p], "n %lld, %g at %lld: found %lld, want %lld", (long long)n,
                      (double)bad[b], (long long)places[p], (long long)got, (long long)want);
                /* the same floats 1 byte off alignment (a file's f32 tensor after int8 ones) */
                memcpy(unaligned + 1, x, (size_t)n * sizeof(float));
                got = dmrt_first_non_finite(unaligned + 1, n);
                CHECK(got == want, "n %lld, %g at %lld, unaligned: found %lld, want %lld", (long long)n, (double)bad[b],
                      (long long)places[p], (long long)got, (long long)want);
                cases++;
                if (later < n) x[later] = saved_later;
                x[places[p]] = saved;
            }
        }
    }
    free(x);
    free(unaligned);
    printf("%d cases: %s\n", cases, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
