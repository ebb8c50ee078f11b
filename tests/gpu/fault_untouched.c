/* fault_untouched.c: a step that a bad index fails changes nothing that outlives it, through
 * gpt.dm's C API (the tiny config: V=64, T=16, B=4), for test_faults.py, which builds it in
 * place of dmc run's main.c (C or CUDA target alike). Context a trains a good step, a step
 * with a bad token id, one with a bad target, and a good step; context b, created from the
 * same seed, the two good steps. The failures must be DMRT_ERR_DATA with the id's and the
 * target's messages, and a's last loss and saved weights must equal b's bit for bit: the
 * failed steps' updates (on a GPU enqueued before the fault is read, and skipped by the
 * update kernels) and their step count left no trace. Exits 0, or 1 naming the check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

enum { V = 64, T = 16, B = 4 };

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fault_untouched: %s:%d: ", __FILE__, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static long read_file(const char *path, char **data) {
    FILE *f = fopen(path, "rb");
    CHECK(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)n + 1);
    CHECK(*data && fread(*data, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    fclose(f);
    return n;
}

int main(void) {
    static int32_t tokens[B * T], targets[B * T], bad_tokens[B * T], bad_targets[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + 3) % V, targets[i] = (i * 11 + 5) % V;
    memcpy(bad_tokens, tokens, sizeof tokens);
    memcpy(bad_targets, targets, sizeof targets);
    bad_tokens[3 * T + 5] = 70;
    bad_targets[0 * T + 2] = -1;
    const gpt_batch good = {tokens, targets}, bad_id = {bad_tokens, targets}, bad_target = {tokens, bad_targets};
    char err[512];
    gpt_ctx *a = gpt_create(7, err, sizeof err);
    CHECK(a, "create: %s", err);
    gpt_ctx *b = gpt_create(7, err, sizeof err);
    CHECK(b, "create: %s", err);
    float la = 0, lb = 0, untouched = -12345.0f;
    CHECK(gpt_train_step(a, &good, &la) == DMRT_OK, "a's step 1: %s", gpt_error(a));
    CHECK(gpt_train_step(b, &good, &lb) == DMRT_OK, "b's step 1: %s", gpt_error(b));
    CHECK(gpt_train_step(a, &bad_id, &untouched) == DMRT_ERR_DATA, "a bad id must fail the step with DMRT_ERR_DATA");
    CHECK(strstr(gpt_error(a), "id 70 at [3, 5] of 'tokens' is outside [0, 64)"), "bad id: %s", gpt_error(a));
    CHECK(gpt_train_step(a, &bad_target, &untouched) == DMRT_ERR_DATA, "a bad target must fail the step");
    CHECK(strstr(gpt_error(a), "target -1 at [0, 2] of 'targets' is outside [0, 64)"), "bad target: %s", gpt_error(a));
    CHECK(untouched == -12345.0f, "a failed step wrote its loss (%g)", untouched);
    CHECK(gpt_train_step(a, &good, &la) == DMRT_OK, "a's good step after the faults: %s", gpt_error(a));
    CHECK(gpt_train_step(b, &good, &lb) == DMRT_OK, "b's step 2: %s", gpt_error(b));
    CHECK(memcmp(&la, &lb, sizeof la) == 0, "loss after the failed steps %.9g, without them %.9g", la, lb);
    CHECK(gpt_save_weights(a, "a.safetensors") == DMRT_OK, "save: %s", gpt_error(a));
    CHECK(gpt_save_weights(b, "b.safetensors") == DMRT_OK, "save: %s", gpt_error(b));
    char *wa, *wb;
    long na = read_file("a.safetensors", &wa), nb = read_file("b.safetensors", &wb);
    CHECK(na == nb && memcmp(wa, wb, (size_t)na) == 0, "the weights after the failed steps differ from those without them");
    free(wa), free(wb);
    gpt_destroy(a);
    gpt_destroy(b);
    printf("fault_untouched: ok (loss %.9g)\n", la);
    return 0;
}
