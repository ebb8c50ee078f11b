/* softmax.c: see softmax.h. */
#include "softmax.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sm_cfg {
    int64_t B, D, C;
    float lr;
} sm_cfg;

typedef struct sm_ctx {
    sm_cfg cfg;
    float *w;       /* (C, D) */
    float *b;       /* (C) */
    float *gw;      /* (C, D) */
    float *gb;      /* (C) */
    float *logits;  /* (B, C) */
    float *probs;   /* (B, C) */
    float *dlogits; /* (B, C) */
    char err[256];
} sm_ctx;

static const sm_cfg small_cfg = {8, 4, 3, 0.1f};
static const sm_cfg mnist_cfg = {100, 784, 10, 0.1f};

static void destroy(void *p) {
    sm_ctx *c = p;
    if (!c) return;
    dmrt_free(c->w);
    dmrt_free(c->b);
    dmrt_free(c->gw);
    dmrt_free(c->gb);
    dmrt_free(c->logits);
    dmrt_free(c->probs);
    dmrt_free(c->dlogits);
    free(c);
}

static void *create(const sm_cfg *cfg, uint64_t seed, char *err, size_t errlen) {
    sm_ctx *c = calloc(1, sizeof *c);
    if (!c) return snprintf(err, errlen, "out of memory"), NULL;
    c->cfg = *cfg;
    size_t cd = (size_t)(cfg->C * cfg->D) * sizeof(float), bc = (size_t)(cfg->B * cfg->C) * sizeof(float);
    c->w = dmrt_alloc(cd);
    c->gw = dmrt_alloc(cd);
    c->b = dmrt_alloc((size_t)cfg->C * sizeof(float));
    c->gb = dmrt_alloc((size_t)cfg->C * sizeof(float));
    c->logits = dmrt_alloc(bc);
    c->probs = dmrt_alloc(bc);
    c->dlogits = dmrt_alloc(bc);
    if (!c->w || !c->gw || !c->b || !c->gb || !c->logits || !c->probs || !c->dlogits) {
        destroy(c);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    dmrt_rng rng;
    dmrt_rng_init(&rng, seed, 1);
    dmrt_fill_normal(c->w, cfg->C * cfg->D, 0.0f, 0.01f, &rng);
    return c;
}

static void *create_small(uint64_t seed, char *err, size_t errlen) {
    return create(&small_cfg, seed, err, errlen);
}
static void *create_mnist(uint64_t seed, char *err, size_t errlen) {
    return create(&mnist_cfg, seed, err, errlen);
}

static void *param(void *p, int i) {
    sm_ctx *c = p;
    return i == 0 ? (void *)c->w : i == 1 ? (void *)c->b : NULL;
}
static void *grad(void *p, int i) {
    sm_ctx *c = p;
    return i == 0 ? (void *)c->gw : i == 1 ? (void *)c->gb : NULL;
}
static const void *output(void *p, int i) {
    sm_ctx *c = p;
    return i == 0 ? (const void *)c->probs : i == 1 ? (const void *)c->logits : NULL;
}
static const char *error(void *p) { return ((sm_ctx *)p)->err; }

static int forward(void *p, const void *const *inputs, float *loss) {
    sm_ctx *c = p;
    const sm_cfg *k = &c->cfg;
    const float *x = inputs[0];
    const int32_t *y = inputs[1];
    c->err[0] = '\0';
    /* logits = x @ w^T + b */
    for (int64_t i = 0; i < k->B; i++) memcpy(c->logits + i * k->C, c->b, (size_t)k->C * sizeof(float));
    dmrt_sgemm(0, 1, k->B, k->C, k->D, 1.0f, x, k->D, c->w, k->D, 1.0f, c->logits, k->C);
    double total = 0.0;
    for (int64_t i = 0; i < k->B; i++) {
        if (y[i] < 0 || y[i] >= k->C) {
            snprintf(c->err, sizeof c->err, "label %d of example %lld is outside [0, %lld)",
                     (int)y[i], (long long)i, (long long)k->C);
            return 1;
        }
        const float *l = c->logits + i * k->C;
        float *pr = c->probs + i * k->C;
        float mx = l[0];
        for (int64_t j = 1; j < k->C; j++) mx = l[j] > mx ? l[j] : mx;
        double s = 0.0;
        for (int64_t j = 0; j < k->C; j++) s += exp((double)(l[j] - mx));
        for (int64_t j = 0; j < k->C; j++) pr[j] = (float)(exp((double)(l[j] - mx)) / s);
        total += log(s) - (double)(l[y[i]] - mx);
    }
    *loss = (float)(total / (double)k->B);
    return 0;
}

static int train_step(void *p, const void *const *inputs, float *loss) {
    sm_ctx *c = p;
    const sm_cfg *k = &c->cfg;
    if (forward(p, inputs, loss) != 0) return 1;
    const float *x = inputs[0];
    const int32_t *y = inputs[1];
    /* dlogits = (probs - onehot(y)) / B; gw = dlogits^T @ x; gb = sum_i dlogits */
    for (int64_t i = 0; i < k->B; i++)
        for (int64_t j = 0; j < k->C; j++)
            c->dlogits[i * k->C + j] =
                (c->probs[i * k->C + j] - (j == y[i] ? 1.0f : 0.0f)) / (float)k->B;
    dmrt_sgemm(1, 0, k->C, k->D, k->B, 1.0f, c->dlogits, k->C, x, k->D, 0.0f, c->gw, k->D);
    for (int64_t j = 0; j < k->C; j++) {
        float s = 0.0f;
        for (int64_t i = 0; i < k->B; i++) s += c->dlogits[i * k->C + j];
        c->gb[j] = s;
    }
    for (int64_t q = 0; q < k->C * k->D; q++) c->w[q] -= k->lr * c->gw[q];
    for (int64_t j = 0; j < k->C; j++) c->b[j] -= k->lr * c->gb[j];
    return 0;
}

static const dmrt_tensor_desc small_inputs[] = {
    {.name = "x", .dtype = DMRT_F32, .rank = 2, .shape = {8, 4}, .numel = 32},
    {.name = "y", .dtype = DMRT_I32, .rank = 1, .shape = {8}, .numel = 8},
};
static const dmrt_tensor_desc small_params[] = {
    {.name = "fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {3, 4}, .numel = 12},
    {.name = "fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {3}, .numel = 3},
};
static const dmrt_tensor_desc small_outputs[] = {
    {.name = "probs", .dtype = DMRT_F32, .rank = 2, .shape = {8, 3}, .numel = 24},
    {.name = "logits", .dtype = DMRT_F32, .rank = 2, .shape = {8, 3}, .numel = 24},
};

static const dmrt_tensor_desc mnist_inputs[] = {
    {.name = "x", .dtype = DMRT_F32, .rank = 2, .shape = {100, 784}, .numel = 78400},
    {.name = "y", .dtype = DMRT_I32, .rank = 1, .shape = {100}, .numel = 100},
};
static const dmrt_tensor_desc mnist_params[] = {
    {.name = "fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {10, 784}, .numel = 7840},
    {.name = "fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {10}, .numel = 10},
};
static const dmrt_tensor_desc mnist_outputs[] = {
    {.name = "probs", .dtype = DMRT_F32, .rank = 2, .shape = {100, 10}, .numel = 1000},
    {.name = "logits", .dtype = DMRT_F32, .rank = 2, .shape = {100, 10}, .numel = 1000},
};

const dmrt_model softmax_small_model = {
    .name = "softmax_small",
    .n_inputs = 2, .inputs = small_inputs,
    .n_params = 2, .params = small_params,
    .n_outputs = 2, .outputs = small_outputs,
    .create = create_small, .destroy = destroy, .param = param, .grad = grad,
    .forward = forward, .train_step = train_step, .output = output, .error = error,
};

const dmrt_model softmax_mnist_model = {
    .name = "softmax_mnist",
    .n_inputs = 2, .inputs = mnist_inputs,
    .n_params = 2, .params = mnist_params,
    .n_outputs = 2, .outputs = mnist_outputs,
    .create = create_mnist, .destroy = destroy, .param = param, .grad = grad,
    .forward = forward, .train_step = train_step, .output = output, .error = error,
};
