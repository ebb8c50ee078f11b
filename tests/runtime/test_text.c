/* test_text: dmrt_text_read (a corpus from files) and dmrt_sample_logits (the sampler
 * behind --sample) on their own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "dmrt.h"
#include "testutil.h"

static int test_read(const char *dir) {
    int fails = 0;
    char a[4096], b[4096], big[4096], empty[4096], missing[4096], sub[4096], err[1024];
    const unsigned char bytes_b[] = {'c', 0, 255, '\n'};
    tu_write(tu_path(a, sizeof a, dir, "a.txt"), "ab", 2);
    tu_write(tu_path(b, sizeof b, dir, "b.bin"), bytes_b, sizeof bytes_b);
    tu_write(tu_path(empty, sizeof empty, dir, "empty.txt"), "", 0);
    tu_path(missing, sizeof missing, dir, "missing.txt");
    mkdir(tu_path(sub, sizeof sub, dir, "sub"), 0755);
    /* larger than the first buffer, so the corpus must grow while reading */
    enum { BIG = 200003 };
    unsigned char *big_bytes = malloc(BIG);
    for (int i = 0; i < BIG; i++) big_bytes[i] = (unsigned char)(i * 31 + i / 7);
    tu_write(tu_path(big, sizeof big, dir, "big.bin"), big_bytes, BIG);

    dmrt_text t;
    const char *ab[] = {a, b, big};
    CHECK(dmrt_text_read(&t, 3, ab, err, sizeof err) == 0, "read: %s", err);
    CHECK(t.size == 2 + 4 + BIG && t.n_files == 3 && t.file_sizes[0] == 2 && t.file_sizes[1] == 4 &&
              t.file_sizes[2] == BIG,
          "sizes %lld", (long long)t.size);
    CHECK(t.bytes && memcmp(t.bytes, "ab", 2) == 0 && memcmp(t.bytes + 2, bytes_b, 4) == 0 &&
              memcmp(t.bytes + 6, big_bytes, BIG) == 0,
          "the corpus is not the files' bytes in order");
    dmrt_text_free(&t);
    free(big_bytes);

    struct {
        const char *path, *phrase;
    } bad[] = {
        {missing, ": cannot open: No such file or directory"},
        {empty, ": the file is empty"},
        {sub, ": cannot read: Is a directory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *paths[] = {a, bad[i].path};
        err[0] = '\0';
        CHECK(dmrt_text_read(&t, 2, paths, err, sizeof err) != 0, "%s accepted", bad[i].path);
        CHECK_MSG(err, bad[i].path, bad[i].phrase);
        CHECK(t.bytes == NULL && t.size == 0 && t.file_sizes == NULL, "failed read left memory");
    }
    CHECK(dmrt_text_read(&t, 0, ab, err, sizeof err) != 0, "no files accepted");
    return fails;
}

/* How often each index of logits comes out of `draws` samples. */
static void histogram(const float *logits, int n, float temperature, int top_k, int draws,
                      int *counts) {
    dmrt_rng rng;
    dmrt_rng_init(&rng, 11, 3);
    memset(counts, 0, (size_t)n * sizeof *counts);
    for (int i = 0; i < draws; i++) {
        int token = -1;
        int rc = dmrt_sample_logits(logits, n, temperature, top_k, &rng, &token);
        if (rc != DMRT_OK || token < 0 || token >= n) return;
        counts[token]++;
    }
}

static int test_sample(void) {
    int fails = 0;
    dmrt_rng rng;
    dmrt_rng_init(&rng, 1, 2);
    int token = -1;

    /* greedy: the first of equal maxima, no draw */
    const float ties[] = {1.0f, 5.0f, 5.0f, 2.0f};
    CHECK(dmrt_sample_logits(ties, 4, 0.0f, 40, &rng, &token) == DMRT_OK && token == 1,
          "temperature 0 gave %d", token);
    CHECK(dmrt_sample_logits(ties, 4, 1.0f, 1, &rng, &token) == DMRT_OK && token == 1,
          "top-k 1 gave %d", token);
    CHECK(rng.counter == 0, "greedy sampling drew %llu numbers", (unsigned long long)rng.counter);
    /* otherwise exactly one draw per call */
    CHECK(dmrt_sample_logits(ties, 4, 1.0f, 0, &rng, &token) == DMRT_OK && rng.counter == 1,
          "a draw used %llu numbers", (unsigned long long)rng.counter);

    /* bad logits and arguments */
    const float with_nan[] = {0.0f, NAN}, with_inf[] = {0.0f, INFINITY},
                masked[] = {-INFINITY, -INFINITY};
    const struct {
        const float *logits;
        int n, top_k;
        float temperature;
        int want;
        const char *what;
    } bad[] = {
        {with_nan, 2, 0, 1.0f, DMRT_ERR_DATA, "NaN logit"},
        {with_inf, 2, 0, 0.0f, DMRT_ERR_DATA, "+inf logit"},
        {masked, 2, 0, 1.0f, DMRT_ERR_DATA, "all -inf"},
        {ties, 0, 0, 1.0f, DMRT_ERR_ARG, "n 0"},
        {ties, 4, -1, 1.0f, DMRT_ERR_ARG, "top-k -1"},
        {ties, 4, 0, -1.0f, DMRT_ERR_ARG, "temperature -1"},
        {ties, 4, 0, NAN, DMRT_ERR_ARG, "temperature NaN"},
        {ties, 4, 0, INFINITY, DMRT_ERR_ARG, "temperature inf"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = dmrt_sample_logits(bad[i].logits, bad[i].n, bad[i].temperature, bad[i].top_k,
                                    &rng, &token);
        CHECK(rc == bad[i].want, "%s: returned %d, want %d", bad[i].what, rc, bad[i].want);
    }

    enum { DRAWS = 60000 };
    int counts[8];
    /* -inf is never drawn */
    const float some_masked[] = {-INFINITY, 0.0f, -INFINITY, 0.0f};
    histogram(some_masked, 4, 1.0f, 0, DRAWS, counts);
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[1] + counts[3] == DRAWS &&
              counts[1] > DRAWS / 3,
          "masked: %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
    /* top-k 2 over {2, 1, 1, 1}: index 0 and the first of the equal ones */
    const float boundary[] = {2.0f, 1.0f, 1.0f, 1.0f};
    histogram(boundary, 4, 1.0f, 2, DRAWS, counts);
    CHECK(counts[2] == 0 && counts[3] == 0 && counts[0] + counts[1] == DRAWS && counts[1] > 0,
          "top-k 2: %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
    /* frequencies follow softmax(logits / temperature): weights 1, 2, 3 at temperature 1,
     * 1, sqrt 2, sqrt 3 at temperature 2; the fourth is outside top-k 3 */
    const float weights[] = {0.0f, logf(2.0f), logf(3.0f), -0.5f};
    const double want1[] = {1.0 / 6, 2.0 / 6, 3.0 / 6, 0.0};
    const double s2 = 1.0 + sqrt(2.0) + sqrt(3.0);
    const double want2[] = {1.0 / s2, sqrt(2.0) / s2, sqrt(3.0) / s2, 0.0};
    const struct {
        float temperature;
        const double *want;
    } freq[] = {{1.0f, want1}, {2.0f, want2}};
    for (int f = 0; f < 2; f++) {
        histogram(weights, 4, freq[f].temperature, 3, DRAWS, counts);
        for (int i = 0; i < 4; i++) {
            double got = (double)counts[i] / DRAWS;
            /* 5 standard deviations of a frequency over 60000 draws is below 0.011 */
            CHECK(fabs(got - freq[f].want[i]) < 0.011,
                  "temperature %g: index %d drawn %.4f, want %.4f", (double)freq[f].temperature, i,
                  got, freq[f].want[i]);
        }
    }
    return fails;
}

int main(void) {
    char dir[4096];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    int fails = test_read(dir) + test_sample();
    tu_rmdir(dir);
    if (fails) fprintf(stderr, "test_text: %d failures\n", fails);
    return fails != 0;
}
