/* host_lr.c: a host program embedding the code dmc generates for tests/spmd/clip.dm
 * (sgd with lr = 0.1, warmup = 3, decay = cosine, min_lr = 0.01, clip = 0.25) drives the
 * learning rate through the generated API (meson test `codegen-host-lr`):
 *   - a decaying schedule without clip_set_total_steps fails train_step, before any work
 *     (the step counter and the parameters unchanged), with a message naming the call;
 *   - bad arguments to the setters are refused;
 *   - with the total set, clip_lr reports each update's rate by the formulas of
 *     docs/language.md;
 *   - a second context whose host calls clip_set_lr with those rates before each step
 *     trains to the same parameters bit for bit (the rate is the same run-time value);
 *   - clip_set_lr(ctx, 0) leaves the parameters as they are (nothing is a literal). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "clip.h"

enum { STEPS = 8, WARMUP = 3, ROWS = 16, FEATURES = 24, CLASSES = 8 };
static const double LR = 0.1, MIN_LR = 0.01, PI = 3.14159265358979323846;

static int fails = 0;
#define CHECK(cond, ...)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            fails++;                                                                  \
        }                                                                             \
    } while (0)

/* The rate of update s by the documented formulas (the test's own, not dmrt_lr_at). */
static double expected_lr(int s) {
    if (s <= WARMUP) return LR * s / WARMUP;
    return MIN_LR + (LR - MIN_LR) * (1 + cos(PI * (s - WARMUP) / (STEPS - WARMUP))) / 2;
}

static float xs[STEPS][ROWS * FEATURES];
static int32_t ys[STEPS][ROWS];

static void make_batches(void) {
    uint64_t state = 42;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < ROWS * FEATURES; i++) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            xs[s][i] = (float)((double)(state >> 40) / (double)(1 << 24) * 2.0 - 1.0);
        }
        for (int r = 0; r < ROWS; r++) ys[s][r] = (int32_t)((s * 7 + r * 3) % CLASSES);
    }
}

static clip_batch batch(int s) { return (clip_batch){.x = xs[s], .y = ys[s]}; }

/* Whether every parameter of a and b is the same, bit for bit. */
static int same_params(clip_ctx *a, clip_ctx *b) {
    for (int i = 0; i < clip_model.n_params; i++)
        if (memcmp(clip_model.param(a, i), clip_model.param(b, i), (size_t)clip_model.params[i].numel * sizeof(float)))
            return 0;
    return 1;
}

int main(void) {
    make_batches();
    clip_ctx *a = clip_create(7, NULL, 0), *b = clip_create(7, NULL, 0), *fresh = clip_create(7, NULL, 0);
    if (!a || !b || !fresh) {
        fprintf(stderr, "clip_create failed\n");
        return 1;
    }
    float loss;
    clip_batch b0 = batch(0);

    /* the decay needs N */
    CHECK(clip_train_step(a, &b0, &loss) == DMRT_ERR_ARG, "train_step without the total steps");
    CHECK(strstr(clip_error(a), "clip_set_total_steps") && strstr(clip_error(a), "decay = cosine"), "message: %s",
          clip_error(a));
    CHECK(same_params(a, fresh), "the failed step changed parameters");
    CHECK(clip_lr(a) == 0.0, "no update yet, lr %g", clip_lr(a));

    CHECK(clip_set_total_steps(a, -1) == DMRT_ERR_ARG, "negative total");
    CHECK(clip_set_lr(a, -0.5) == DMRT_ERR_ARG, "negative lr");
    CHECK(clip_set_lr(a, NAN) == DMRT_ERR_ARG && strstr(clip_error(a), "clip_set_lr"), "NaN lr: %s", clip_error(a));
    CHECK(clip_model.set_total_steps && clip_model.set_lr && clip_model.lr, "the descriptor's learning-rate calls");

    /* a: the built-in schedule; b: the host's, the same rates */
    CHECK(clip_set_total_steps(a, STEPS) == DMRT_OK, "%s", clip_error(a));
    for (int s = 1; s <= STEPS; s++) {
        clip_batch in = batch(s - 1);
        CHECK(clip_train_step(a, &in, &loss) == DMRT_OK, "step %d: %s", s, clip_error(a));
        double want = expected_lr(s);
        CHECK(fabs(clip_lr(a) - want) <= 1e-15 * want, "step %d: lr %.17g, expected %.17g", s, clip_lr(a), want);
        CHECK(clip_set_lr(b, clip_lr(a)) == DMRT_OK, "%s", clip_error(b));
        CHECK(clip_train_step(b, &in, &loss) == DMRT_OK, "step %d: %s", s, clip_error(b));
        CHECK(clip_lr(b) == clip_lr(a), "step %d: the host's lr %.17g, the schedule's %.17g", s, clip_lr(b), clip_lr(a));
    }
    CHECK(!same_params(a, fresh), "training changed nothing");
    CHECK(same_params(a, b), "the host's schedule trained other parameters than the built-in one");

    /* a pinned rate of 0 (without a total: the host's rate needs none) */
    CHECK(clip_set_lr(fresh, 0.0) == DMRT_OK, "%s", clip_error(fresh));
    clip_ctx *untouched = clip_create(7, NULL, 0);
    CHECK(clip_train_step(fresh, &b0, &loss) == DMRT_OK, "%s", clip_error(fresh));
    CHECK(untouched && same_params(fresh, untouched), "lr 0 moved the parameters");

    clip_destroy(a);
    clip_destroy(b);
    clip_destroy(fresh);
    clip_destroy(untouched);
    if (fails) fprintf(stderr, "%d checks failed\n", fails);
    else printf("PASS: the learning rate is a run-time value: schedule, host override, errors\n");
    return fails ? 1 : 0;
}
