/* bytelm: a fake byte-level language model written against the dmrt_model interface,
 * run by dmrt_trainer_main, for the text-data and sampling tests (test_textlm.c).
 *
 *   bytelm_train VARIANT CORPUS LOG [trainer options]
 *
 * CORPUS is the whole corpus the trainer is expected to see (the test writes it next to
 * the files it passes with --data text:...), or "-"; LOG receives one line per call,
 * "train o0 o1 ..." or "forward o0 o1 ...", the corpus offset of each row's window (-1
 * when a row is not a window of the corpus), or "-" for no log.
 *
 * The model: inputs tokens, targets: i32[B, T]; parameter scale: f32[1]; output
 * logits: f32[B, T, V]. At every position with token c, the logits give bytes
 * lm_likeliest(c), lm_second(c), lm_third(c) the logits 3, 1, 0 and every other byte
 * -1e30 (probability exactly 0 in float and double), while the ids >= 256 get 100,
 * which a sampler over bytes must ignore. forward's loss is the mean of the targets, so the
 * test can predict the validation loss from the windows the trainer should pick.
 * train_step fails unless every row is a window of the training part (the first 90% of
 * the corpus, the last 10% but at least T+1 bytes held out) and returns the same loss.
 *
 * Variants: lm (B 3, T 8, V 260); vocab200, f32tokens, targets9 (shapes the trainer
 * must refuse); softmax (the softmax regression of softmax.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytelm.h"
#include "dmrt.h"
#include "softmax.h"
#include "testutil.h"

enum { B = LM_BATCH, T = LM_LEN, V = LM_VOCAB };

/* What the whole test process shares with the model's callbacks: set by main before
 * the trainer runs (a test program may have globals; the runtime may not). */
static unsigned char *corpus;
static int64_t corpus_size, train_bytes;
static FILE *log_file;

typedef struct lm_ctx {
    float scale, scale_grad;
    float *logits; /* (B, T, V) */
    char err[256];
} lm_ctx;

static void *lm_create(uint64_t seed, char *err, size_t errlen) {
    lm_ctx *c = calloc(1, sizeof *c);
    if (c) c->logits = dmrt_alloc((size_t)B * T * V * sizeof(float));
    if (!c || !c->logits) {
        if (c) free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->scale = (float)(seed % 100);
    return c;
}

static void lm_destroy(void *p) {
    lm_ctx *c = p;
    if (!c) return;
    dmrt_free(c->logits);
    free(c);
}

static void *lm_param(void *p, int i) { return i == 0 ? &((lm_ctx *)p)->scale : NULL; }
static void *lm_grad(void *p, int i) { return i == 0 ? &((lm_ctx *)p)->scale_grad : NULL; }
static const void *lm_output(void *p, int i) { return i == 0 ? ((lm_ctx *)p)->logits : NULL; }
static const char *lm_error(void *p) { return ((lm_ctx *)p)->err; }

/* The offset o < limit where corpus[o, o+T) are the tokens and corpus[o+1, o+T+1) the
 * targets of a row; -1 if none. */
static int64_t find_window(const int32_t *tokens, const int32_t *targets, int64_t limit) {
    for (int64_t o = 0; o < limit; o++) {
        int match = 1;
        for (int t = 0; t < T && match; t++)
            match = tokens[t] == corpus[o + t] && targets[t] == corpus[o + t + 1];
        if (match) return o;
    }
    return -1;
}

static void log_rows(const char *kind, const int32_t *tokens, const int32_t *targets) {
    if (!log_file) return;
    fputs(kind, log_file);
    for (int r = 0; r < B; r++)
        fprintf(log_file, " %lld",
                (long long)(corpus ? find_window(tokens + r * T, targets + r * T, corpus_size - T)
                                   : -1));
    fputc('\n', log_file);
    fflush(log_file);
}

static float mean_target(const int32_t *targets) {
    double sum = 0.0;
    for (int i = 0; i < B * T; i++) sum += targets[i];
    return (float)(sum / (B * T));
}

static int lm_forward(void *p, const void *const *in, float *loss) {
    lm_ctx *c = p;
    const int32_t *tokens = in[0], *targets = in[1];
    log_rows("forward", tokens, targets);
    for (int i = 0; i < B * T; i++) {
        float *row = c->logits + (size_t)i * V;
        for (int v = 0; v < V; v++) row[v] = v < 256 ? -1e30f : 100.0f;
        int byte = tokens[i] & 255;
        row[lm_likeliest(byte)] = 3.0f;
        row[lm_second(byte)] = 1.0f;
        row[lm_third(byte)] = 0.0f;
    }
    *loss = mean_target(targets);
    return 0;
}

static int lm_train_step(void *p, const void *const *in, float *loss) {
    lm_ctx *c = p;
    const int32_t *tokens = in[0], *targets = in[1];
    log_rows("train", tokens, targets);
    if (!corpus) return snprintf(c->err, sizeof c->err, "no corpus given to bytelm_train"), 1;
    for (int r = 0; r < B; r++) {
        for (int t = 0; t + 1 < T; t++)
            if (targets[r * T + t] != tokens[r * T + t + 1])
                return snprintf(c->err, sizeof c->err,
                                "row %d: targets are not the tokens shifted by one", r), 1;
        /* offsets o with o + T + 1 <= train_bytes */
        if (find_window(tokens + r * T, targets + r * T, train_bytes - T) < 0)
            return snprintf(c->err, sizeof c->err,
                            "row %d is not a window of the training part (%lld bytes)", r,
                            (long long)train_bytes), 1;
    }
    c->scale_grad = 0.0f;
    *loss = mean_target(targets);
    return 0;
}

#define LM_INPUT(nm, dt, len) {.name = nm, .dtype = dt, .rank = 2, .shape = {B, len}, .numel = B * (len)}
#define LM_LOGITS(vocab) {.name = "logits", .dtype = DMRT_F32, .rank = 3, .shape = {B, T, vocab}, .numel = B * T * (vocab)}

static const dmrt_tensor_desc lm_inputs[] = {LM_INPUT("tokens", DMRT_I32, T),
                                             LM_INPUT("targets", DMRT_I32, T)};
static const dmrt_tensor_desc f32_inputs[] = {LM_INPUT("tokens", DMRT_F32, T),
                                              LM_INPUT("targets", DMRT_I32, T)};
static const dmrt_tensor_desc targets9_inputs[] = {LM_INPUT("tokens", DMRT_I32, T),
                                                   LM_INPUT("targets", DMRT_I32, T + 1)};
static const dmrt_tensor_desc lm_params[] = {
    {.name = "scale", .dtype = DMRT_F32, .rank = 1, .shape = {1}, .numel = 1}};
static const dmrt_tensor_desc lm_outputs[] = {LM_LOGITS(V)};
static const dmrt_tensor_desc vocab200_outputs[] = {LM_LOGITS(200)};

#define LM_MODEL(nm, ins, outs)                                                                 \
    {.name = nm, .n_inputs = 2, .inputs = ins, .n_params = 1, .params = lm_params,             \
     .n_outputs = 1, .outputs = outs, .create = lm_create, .destroy = lm_destroy,               \
     .param = lm_param, .grad = lm_grad, .forward = lm_forward, .train_step = lm_train_step,   \
     .output = lm_output, .error = lm_error}

static const dmrt_model variants[] = {
    LM_MODEL("lm", lm_inputs, lm_outputs),
    LM_MODEL("vocab200", lm_inputs, vocab200_outputs),
    LM_MODEL("f32tokens", f32_inputs, lm_outputs),
    LM_MODEL("targets9", targets9_inputs, lm_outputs),
};

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s VARIANT CORPUS|- LOG|- [trainer options]\n", argv[0]);
        return 2;
    }
    const dmrt_model *m = strcmp(argv[1], "softmax") == 0 ? &softmax_small_model : NULL;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        if (strcmp(argv[1], variants[i].name) == 0) m = &variants[i];
    if (!m) {
        fprintf(stderr, "%s: unknown variant '%s'\n", argv[0], argv[1]);
        return 2;
    }
    if (strcmp(argv[2], "-") != 0) {
        size_t size;
        corpus = (unsigned char *)tu_read(argv[2], &size);
        if (!corpus) {
            fprintf(stderr, "%s: cannot read %s\n", argv[0], argv[2]);
            return 2;
        }
        corpus_size = (int64_t)size;
        train_bytes = corpus_size - lm_val_bytes(corpus_size);
    }
    if (strcmp(argv[3], "-") != 0 && !(log_file = fopen(argv[3], "w"))) {
        fprintf(stderr, "%s: cannot write %s\n", argv[0], argv[3]);
        return 2;
    }
    /* The trainer sees the program name and the options only. */
    char **args = calloc((size_t)argc, sizeof *args);
    if (!args) return 1;
    args[0] = argv[0];
    for (int i = 4; i < argc; i++) args[i - 3] = argv[i];
    int rc = dmrt_trainer_main(m, argc - 3, args);
    free(args);
    free(corpus);
    if (log_file) fclose(log_file);
    return rc;
}
