/* params_io.c: a model's parameters to and from safetensors files.
 *
 * Loading is all-or-nothing: the whole file is read and every parameter checked
 * (present, dtype, shape) before the first byte is copied into the context, so a
 * bad file leaves the context as it was; a tensor with a CRC-32C in the file's metadata (a
 * checkpoint's or a --save file's "dmc.crc32c.<name>") must match it, and saving writes
 * them. A parameter missing under its own name is also looked up with the prefix
 * "transformer." (Hugging Face GPT-2 checkpoints). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Checkpoints saved by Hugging Face's GPT2LMHeadModel carry the GPT-2 body under this
 * prefix ("transformer.h.0.attn.c_attn.weight"); the plain GPT-2 model.safetensors does
 * not. */
#define HF_BODY_PREFIX "transformer."

/* The file's tensor for parameter `name`: the exact name, else HF_BODY_PREFIX + name;
 * NULL when neither is there. */
static const dmrt_st_tensor *find_param_tensor(const dmrt_st_file *f, const char *name) {
    const dmrt_st_tensor *t = dmrt_st_find(f, name);
    if (t) return t;
    size_t plen = strlen(HF_BODY_PREFIX);
    for (int i = 0; i < f->n_tensors; i++) {
        const char *candidate = f->tensors[i].name;
        if (strncmp(candidate, HF_BODY_PREFIX, plen) == 0 && strcmp(candidate + plen, name) == 0)
            return &f->tensors[i];
    }
    return NULL;
}

int dmrt_load_params(const dmrt_model *model, void *ctx, const char *path, char *err,
                     size_t errlen) {
    dmrt_st_file f;
    if (dmrt_st_read(&f, path, err, errlen) != 0) return -1;
    /* source[i]: the file's tensor for parameter i, all found and checked before any is
     * copied */
    const dmrt_st_tensor **source = calloc(model->n_params ? (size_t)model->n_params : 1,
                                           sizeof *source);
    if (!source) {
        dmrt_st_close(&f);
        return dmrt_errorf(err, errlen, "%s: out of memory", path);
    }
    int rc = 0;
    for (int i = 0; i < model->n_params && rc == 0; i++) {
        const dmrt_tensor_desc *d = &model->params[i];
        const dmrt_st_tensor *t = find_param_tensor(&f, d->name);
        if (dmrt_check_tensor(model, path, t, d, "parameter", HF_BODY_PREFIX, err, errlen) != 0)
            rc = -1;
        else if (dmrt_check_crc32c(&f, t, 0, err, errlen) != 0) /* a checkpoint's checksum, when it has one */
            rc = -1;
        else if (dmrt_check_finite_to_load(path, t, d, "parameter", err, errlen) != 0)
            rc = -1;
        else if (!model->scatter && !model->param(ctx, i))
            rc = dmrt_errorf(err, errlen, "%s: model '%s' has no storage for parameter '%s'",
                             path, model->name, d->name);
        source[i] = t;
    }
    if (rc == 0)
        for (int i = 0; i < model->n_params && rc == 0; i++) {
            const dmrt_tensor_desc *d = &model->params[i];
            if (!model->scatter)
                memcpy(model->param(ctx, i), source[i]->data,
                       (size_t)d->numel * dmrt_dtype_size(d->dtype));
            else if (model->scatter(ctx, i, source[i]->data) != 0)
                rc = dmrt_errorf(err, errlen, "%s: loading '%s': %s", path, d->name,
                                 model->error(ctx));
        }
    free(source);
    dmrt_st_close(&f);
    return rc;
}

int dmrt_check_tensor(const dmrt_model *model, const char *path, const dmrt_st_tensor *t, const dmrt_tensor_desc *d,
                      const char *what, const char *also_prefix, char *err, size_t errlen) {
    char want[256], got[256];
    dmrt_shape_str(want, sizeof want, d->rank, d->shape);
    if (!t)
        return dmrt_errorf(err, errlen, "%s: %s '%s' (%s %s) of model '%s' is missing from the file%s%s%s%s", path, what,
                           d->name, dmrt_dtype_name(d->dtype), want, model->name, also_prefix ? " (also as '" : "",
                           also_prefix ? also_prefix : "", also_prefix ? d->name : "", also_prefix ? "')" : "");
    dmrt_shape_str(got, sizeof got, t->rank, t->shape);
    if (t->dtype != d->dtype)
        return dmrt_errorf(err, errlen, "%s: tensor '%s': dtype %s but the model expects %s for %s '%s'", path, t->name,
                           dmrt_dtype_name(t->dtype), dmrt_dtype_name(d->dtype), what, d->name);
    if (t->rank != d->rank || memcmp(t->shape, d->shape, sizeof(int64_t) * (size_t)d->rank))
        return dmrt_errorf(err, errlen, "%s: tensor '%s': shape %s in the file but the model expects %s for %s '%s'", path,
                           t->name, got, want, what, d->name);
    return 0;
}

/* The float at element i of x, which may lie at any address (read by bytes). */
static float float_at(const void *x, int64_t i) {
    float v;
    memcpy(&v, (const char *)x + i * (int64_t)sizeof v, sizeof v);
    return v;
}

int dmrt_check_finite_to_load(const char *path, const dmrt_st_tensor *t, const dmrt_tensor_desc *d, const char *what,
                               char *err, size_t errlen) {
    /* a NaN loaded would surface steps later as some gradient's, or as outputs */
    if (t->dtype != DMRT_F32) return 0;
    /* a file's f32 tensor after 1-byte ones (a quantized file's int8 and int4 weights) lies
     * at any address: dmrt_first_non_finite reads any */
    int64_t at = dmrt_first_non_finite(t->data, d->numel);
    if (at < 0) return 0;
    char shape[256];
    dmrt_shape_str(shape, sizeof shape, d->rank, d->shape);
    return dmrt_errorf(err, errlen, "%s: tensor '%s' (%s '%s') holds a non-finite value: %g at element %lld of %s", path,
                       t->name, what, d->name, (double)float_at(t->data, at), (long long)at, shape);
}

/* The first of x[first .. end) that is not finite, or -1. */
static int64_t first_non_finite_in(const void *x, int64_t first, int64_t end) {
    for (int64_t i = first; i < end; i++)
        if (!isfinite(float_at(x, i))) return i;
    return -1;
}

int64_t dmrt_first_non_finite(const void *x, int64_t n) {
    /* The trainer asks this of every gradient after every step: blocks of 1024 floats are
     * each asked at once, in a loop of fixed length without an early exit that the compiler
     * vectorises even at -O2 (the exponent's bits all set, an infinity or a NaN, carries into
     * the sign bit when 2^23 is added), and only a block that has one is searched element by
     * element. 10.9M floats: 5.2 to 6.2 ms one element at a time, 2.0 to 2.4 ms in blocks
     * (gcc -O2, Zen 4, one thread). */
    enum { BLOCK = 1024 };
    int64_t first = 0;
    for (; n - first >= BLOCK; first += BLOCK) {
        uint32_t carries = 0;
        for (int i = 0; i < BLOCK; i++) {
            uint32_t bits;
            memcpy(&bits, (const char *)x + (first + i) * (int64_t)sizeof bits, sizeof bits);
            carries |= (bits & 0x7f800000u) + 0x00800000u;
        }
        if (carries & 0x80000000u) return first_non_finite_in(x, first, first + BLOCK);
    }
    return first_non_finite_in(x, first, n);
}

int dmrt_check_finite_to_write(const char *path, const char *what, const dmrt_tensor_desc *d, const float *data,
                               int64_t step, char *err, size_t errlen) {
    int64_t at = dmrt_first_non_finite(data, d->numel);
    if (at < 0) return 0;
    char shape[256];
    dmrt_shape_str(shape, sizeof shape, d->rank, d->shape);
    return dmrt_errorf(err, errlen,
                       "%s not written: %s '%s' holds a non-finite value (%g at element %lld of %s) after step %lld; "
                       "the files already there are left as they were",
                       path, what, d->name, (double)data[at], (long long)at, shape, (long long)step);
}

/* Every parameter (grad 0) or gradient (grad 1) to path, with each tensor's CRC-32C in the
 * metadata ("dmc.crc32c.<name>", as checkpoints: a flipped bit on the disk is refused by the
 * --init that loads it). An SPMD model's tensors are gathered whole on every rank (a
 * collective), and only world rank 0 writes: it keeps each one, the other ranks gather each
 * into one buffer of the largest, reused. */
static int save_tensors(const dmrt_model *model, void *ctx, int grad, const char *path, char *err,
                        size_t errlen) {
    int n = model->n_params;
    const int writes = !model->rank_id || model->rank_id(ctx) == 0;
    const void **data = calloc(n ? (size_t)n : 1, sizeof *data);
    float **whole = calloc(n ? (size_t)n : 1, sizeof *whole);
    int64_t largest = 0;
    for (int i = 0; i < n; i++)
        if (model->params[i].numel > largest) largest = model->params[i].numel;
    float *passing = model->gather && !writes ? dmrt_alloc((size_t)(largest ? largest : 1) * sizeof(float)) : NULL;
    int rc = 0;
    if (!data || !whole || (model->gather && !writes && !passing)) rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
    /* weights that are not finite are never written (gradients are: --dump-grads is for
     * looking at them); each is checked as it is gathered, whole and alike on every rank,
     * so that every rank fails at the same tensor */
    int64_t step = model->step ? model->step(ctx) : 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!model->gather) {
            data[i] = grad ? model->grad(ctx, i) : model->param(ctx, i);
        } else {
            /* a failed gather leaves this rank's share of the others' collectives undone:
             * they fail on their deadline or this rank's abort, never half-write the file */
            float *into = writes ? (whole[i] = dmrt_alloc((size_t)model->params[i].numel * sizeof(float))) : passing;
            if (!into) rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
            else if (model->gather(ctx, i, grad, into) != 0)
                rc = dmrt_errorf(err, errlen, "%s: gathering '%s': %s", path, model->params[i].name,
                                 model->error(ctx));
            data[i] = into;
        }
        if (rc == 0 && !grad)
            rc = dmrt_check_finite_to_write(path, "parameter", &model->params[i], data[i], step, err, errlen);
    }
    if (rc == 0 && writes) {
        dmrt_file_meta meta;
        if (dmrt_file_meta_with_crc32c(&meta, 0, NULL, NULL, n, model->params, data) != 0)
            rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
        else
            rc = dmrt_st_write_meta(path, n, model->params, data, meta.n, meta.keys, meta.values, err, errlen);
        dmrt_file_meta_free(&meta);
    }
    for (int i = 0; whole && i < n; i++) dmrt_free(whole[i]);
    dmrt_free(passing);
    free(whole);
    free(data);
    return rc;
}

int dmrt_save_params(const dmrt_model *model, void *ctx, const char *path, char *err,
                     size_t errlen) {
    return save_tensors(model, ctx, 0, path, err, errlen);
}

int dmrt_save_grads(const dmrt_model *model, void *ctx, const char *path, char *err,
                    size_t errlen) {
    if (!model->grad) return dmrt_errorf(err, errlen, "%s: model '%s' exposes no gradients", path, model->name);
    return save_tensors(model, ctx, 1, path, err, errlen);
}
