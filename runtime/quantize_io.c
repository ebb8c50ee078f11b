/* quantize_io.c: a quantized program's narrow weights (dmc --quantize, docs/compression.md)
 * made from its f32 parameters, written to a safetensors file (--save-quantized) and read
 * back (--init). A quantized program is serial (dmc refuses --quantize with a mesh); its
 * parameters are model->param's host memory, or (the CUDA target: gather and scatter set)
 * device memory reached through host copies. The narrow weights' host copy (qweight) is
 * the one this file reads and writes; qweight_sync, where set, then puts it where the
 * products read it. int8-weights and int4-weights hold a weight that only quantized
 * products read narrow only (qweight's narrow_only), on both targets: no f32 parameter,
 * gather dequantizes it and scatter quantizes it (an --init f32 file's values, once; on the
 * CUDA target scatter uploads it too). */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "internal.h"

#define QUANTIZED_FORMAT "dmc quantized 1"

/* Parameter i in host memory: the context's own where the host addresses it (no gather),
 * else a new host buffer (*copy, which put_param scatters and frees), gathered first when
 * `read`. NULL with a message on failure. */
static float *param_on_host(const dmrt_model *model, void *ctx, int i, int read, float **copy, char *err,
                            size_t errlen) {
    *copy = NULL;
    if (!model->gather) return model->param(ctx, i);
    if (!(*copy = dmrt_alloc((size_t)model->params[i].numel * sizeof(float)))) {
        dmrt_errorf(err, errlen, "'%s': out of memory for its host copy", model->params[i].name);
        return NULL;
    }
    if (read && model->gather(ctx, i, 0, *copy) != 0) {
        dmrt_errorf(err, errlen, "gathering '%s': %s", model->params[i].name, model->error(ctx));
        dmrt_free(*copy);
        return *copy = NULL;
    }
    return *copy;
}

/* Back from param_on_host: copy (if any) scattered into parameter i when `write`, then
 * freed. 0, or -1 with a message. */
static int put_param(const dmrt_model *model, void *ctx, int i, float *copy, int write, char *err, size_t errlen) {
    int rc = 0;
    if (copy && write && model->scatter(ctx, i, copy) != 0)
        rc = dmrt_errorf(err, errlen, "loading '%s': %s", model->params[i].name, model->error(ctx));
    dmrt_free(copy);
    return rc;
}

/* qweight i's host copy changed: where the products read another copy, it follows. */
static int sync_qweight(const dmrt_model *model, void *ctx, int i, char *err, size_t errlen) {
    if (!model->qweight_sync || model->qweight_sync(ctx, i) == DMRT_OK) return 0;
    return dmrt_errorf(err, errlen, "copying the narrow '%s' to the device: %s", model->params[i].name, model->error(ctx));
}

int dmrt_quantize_params(const dmrt_model *model, void *ctx, char *err, size_t errlen) {
    for (int i = 0; i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (!q || q->narrow_only) continue; /* scatter quantized it from the f32 values it was given */
        float *copy, *w = param_on_host(model, ctx, i, 1, &copy, err, errlen);
        if (!w) return -1;
        dmrt_quantize_weight(q, w);
        dmrt_dequantize_param(q, w);
        if (put_param(model, ctx, i, copy, 1, err, errlen) != 0 || sync_qweight(model, ctx, i, err, errlen) != 0) return -1;
    }
    return 0;
}

int dmrt_is_quantized_file(const char *path, char *err, size_t errlen) {
    dmrt_st_file f;
    if (dmrt_st_read_meta(&f, path, err, errlen) != 0) return -1;
    int quantized = dmrt_st_meta(&f, "dmc.quantize") != NULL;
    dmrt_st_close(&f);
    return quantized;
}

/* The two tensors of quantized parameter d (q's): the narrow one and its scales. */
static void qweight_descs(const dmrt_tensor_desc *d, const dmrt_qweight *q, char *scale_name,
                          dmrt_tensor_desc *narrow, dmrt_tensor_desc *scale) {
    int64_t packed = q->bits == 8 ? q->cols : (q->cols + 1) / 2;
    *narrow = (dmrt_tensor_desc){d->name, q->bits == 8 ? DMRT_I8 : DMRT_U8, 2, {q->rows, packed}, q->rows * packed};
    *scale = (dmrt_tensor_desc){scale_name, DMRT_F32, 2, {dmrt_qweight_groups(q), q->cols},
                                dmrt_qweight_groups(q) * q->cols};
}

/* The file's tensors: every parameter (f32 or narrow), then the weights' scales, from
 * *inputs_at on (int8) the input scales. descs, data and names hold TENSORS_MAX(model);
 * returns how many. An f32 parameter the host cannot address is a host copy in copies[i]
 * (gathered when saving: `read`), -1 with a message when that fails. */
#define TENSORS_MAX(model) (3 * (size_t)(model)->n_params + 1)
static int quantized_tensors(const dmrt_model *model, void *ctx, dmrt_tensor_desc *descs, const void **data,
                             char (*names)[256], float **copies, int read, int *inputs_at, char *err, size_t errlen) {
    int n = 0, n_scales = 0;
    for (int i = 0; i < model->n_params; i++) {
        const dmrt_qweight *q = model->qweight(ctx, i);
        if (q) n_scales++;
    }
    int scale_at = model->n_params, input_at = model->n_params + n_scales;
    *inputs_at = input_at;
    for (int i = 0; i < model->n_params; i++) {
        const dmrt_tensor_desc *d = &model->params[i];
        dmrt_qweight *q = model->qweight(ctx, i);
        if (!q) {
            descs[n] = *d;
            if (!(data[n++] = param_on_host(model, ctx, i, read, &copies[i], err, errlen))) return -1;
            continue;
        }
        snprintf(names[scale_at], sizeof names[scale_at], "%s.scale", d->name);
        qweight_descs(d, q, names[scale_at], &descs[n], &descs[scale_at]);
        data[n++] = q->data, data[scale_at++] = q->scale;
        if (!q->quantize_input) continue;
        snprintf(names[input_at], sizeof names[input_at], "%s.input_scale", d->name);
        descs[input_at] = (dmrt_tensor_desc){names[input_at], DMRT_F32, 1, {1}, 1};
        data[input_at++] = &q->input_scale;
    }
    return input_at;
}

/* The host copies quantized_tensors made, each scattered back when `write` (after a load),
 * then freed. 0, or -1 with a message. */
static int put_copies(const dmrt_model *model, void *ctx, float **copies, int write, char *err, size_t errlen) {
    int rc = 0;
    for (int i = 0; copies && i < model->n_params; i++)
        if (put_param(model, ctx, i, copies[i], write && rc == 0, err, errlen) != 0) rc = -1;
    free(copies);
    return rc;
}

/* The float at element i of x, which may lie at any address (a file's f32 tensor after
 * 1-byte ones). */
static float float_at(const void *x, int64_t i) {
    float v;
    memcpy(&v, (const char *)x + i * (int64_t)sizeof v, sizeof v);
    return v;
}

/* The first negative element of the floats x[0..n), or -1. A weight's scale is max|w| / qmax
 * (0 for a column of weights too small for a finite reciprocal), never negative: one that is
 * would flip the column's signs. */
static int64_t first_negative(const void *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (float_at(x, i) < 0.0f) return i;
    return -1;
}

/* What dmrt_load_quantized would refuse is not written: every f32 tensor (a bias, a weight's
 * scales, an input scale) finite, a weight's scales (tensors scales_at .. inputs_at) not
 * negative, and an input scale (from inputs_at) positive. 0, or -1 naming the tensor. */
static int writable_tensors(const char *path, int count, const dmrt_tensor_desc *descs, const void **data, int scales_at,
                            int inputs_at, char *err, size_t errlen) {
    char shape[256];
    for (int k = 0; k < count; k++) {
        if (descs[k].dtype != DMRT_F32) continue;
        int64_t at = dmrt_first_non_finite(data[k], descs[k].numel);
        const float *v = data[k];
        if (at >= 0)
            return dmrt_errorf(err, errlen, "%s not written: tensor '%s' holds a non-finite value (%g at element %lld of "
                               "%s)", path, descs[k].name, (double)v[at], (long long)at,
                               dmrt_shape_str(shape, sizeof shape, descs[k].rank, descs[k].shape));
        if (k >= scales_at && k < inputs_at && (at = first_negative(v, descs[k].numel)) >= 0)
            return dmrt_errorf(err, errlen, "%s not written: tensor '%s' holds a negative scale (%g at element %lld of "
                               "%s)", path, descs[k].name, (double)v[at], (long long)at,
                               dmrt_shape_str(shape, sizeof shape, descs[k].rank, descs[k].shape));
        if (k >= inputs_at && !(v[0] > 0.0f))
            return dmrt_errorf(err, errlen, "%s not written: tensor '%s' is %g: an input scale must be positive (not "
                               "calibrated)", path, descs[k].name, (double)v[0]);
    }
    return 0;
}

int dmrt_save_quantized(const dmrt_model *model, void *ctx, const char *path, char *err, size_t errlen) {
    size_t n = TENSORS_MAX(model);
    dmrt_tensor_desc *descs = calloc(n, sizeof *descs);
    const void **data = calloc(n, sizeof *data);
    char(*names)[256] = calloc(n, sizeof *names);
    float **copies = calloc(n, sizeof *copies);
    if (!descs || !data || !names || !copies) {
        free(descs), free(data), free(names), free(copies);
        return dmrt_errorf(err, errlen, "%s: out of memory", path);
    }
    int inputs_at = 0;
    int count = quantized_tensors(model, ctx, descs, data, names, copies, 1, &inputs_at, err, errlen);
    /* and every tensor's CRC-32C, which the loader checks: a flipped bit on the disk */
    const char *keys[] = {"dmc.format", "dmc.model", "dmc.quantize"};
    const char *values[] = {QUANTIZED_FORMAT, model->name, model->quantize};
    dmrt_file_meta meta = {0};
    int rc = count < 0 || writable_tensors(path, count, descs, data, model->n_params, inputs_at, err, errlen) != 0 ? -1 : 0;
    if (rc == 0 && dmrt_file_meta_with_crc32c(&meta, 3, keys, values, count, descs, data) != 0)
        rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
    if (rc == 0) rc = dmrt_st_write_meta(path, count, descs, data, meta.n, meta.keys, meta.values, err, errlen);
    dmrt_file_meta_free(&meta);
    put_copies(model, ctx, copies, 0, err, errlen);
    free(descs), free(data), free(names);
    return rc;
}

/* The file's tensor for d: present, of d's dtype and shape. */
static const dmrt_st_tensor *checked(const dmrt_model *model, const dmrt_st_file *f, const dmrt_tensor_desc *d,
                                     char *err, size_t errlen) {
    const dmrt_st_tensor *t = dmrt_st_find(f, d->name);
    if (dmrt_check_tensor(model, f->path, t, d, "quantized tensor", NULL, err, errlen) != 0) return NULL;
    return t;
}

/* Checks the file's model and mode, then every tensor before anything is copied: its dtype
 * and shape, its CRC-32C where the file has one (files of before them have none), an f32
 * tensor finite, a weight's scales (tensors from model->n_params to inputs_at) not
 * negative, an input scale (from inputs_at) positive. */
static int check_quantized_file(const dmrt_model *model, void *ctx, const dmrt_st_file *f, const dmrt_tensor_desc *descs,
                                int count, int inputs_at, const dmrt_st_tensor **source, char *err, size_t errlen) {
    const char *format = dmrt_st_meta(f, "dmc.format"), *name = dmrt_st_meta(f, "dmc.model");
    const char *mode = dmrt_st_meta(f, "dmc.quantize");
    if (!format || strcmp(format, QUANTIZED_FORMAT) != 0 || !mode)
        return dmrt_errorf(err, errlen, "%s: not a quantized weights file of dmc (--save-quantized writes them)", f->path);
    if (!name || strcmp(name, model->name) != 0)
        return dmrt_errorf(err, errlen, "%s: quantized weights of model '%s', not of '%s'", f->path, name ? name : "?",
                           model->name);
    if (strcmp(mode, model->quantize) != 0)
        return dmrt_errorf(err, errlen, "%s: weights quantized as --quantize %s, but this program is --quantize %s", f->path,
                           mode, model->quantize);
    (void)ctx;
    char shape[256];
    for (int k = 0; k < count; k++) {
        if (!(source[k] = checked(model, f, &descs[k], err, errlen))) return -1;
        if (dmrt_check_crc32c(f, source[k], 0, err, errlen) != 0) return -1;
        /* its f32 tensors (the biases, the weights' scales) finite, as --init's f32 files */
        if (descs[k].dtype == DMRT_F32 &&
            dmrt_check_finite_to_load(f->path, source[k], &descs[k], "quantized tensor", err, errlen) != 0)
            return -1;
        int64_t at = k >= model->n_params && k < inputs_at ? first_negative(source[k]->data, descs[k].numel) : -1;
        if (at >= 0)
            return dmrt_errorf(err, errlen, "%s: tensor '%s' holds a negative scale (%g at element %lld of %s): a "
                               "weight's scales are never negative (max|w| / qmax): the file is corrupt or was "
                               "altered", f->path, descs[k].name, (double)float_at(source[k]->data, at), (long long)at,
                               dmrt_shape_str(shape, sizeof shape, descs[k].rank, descs[k].shape));
        float v = k >= inputs_at ? float_at(source[k]->data, 0) : 1.0f;
        if (!(v > 0.0f && v <= FLT_MAX))
            return dmrt_errorf(err, errlen, "%s: tensor '%s' is %g: an input scale must be positive and finite", f->path,
                               descs[k].name, (double)v);
    }
    return 0;
}

int dmrt_load_quantized(const dmrt_model *model, void *ctx, const char *path, char *err, size_t errlen) {
    dmrt_st_file f;
    if (dmrt_st_read(&f, path, err, errlen) != 0) return -1;
    size_t n = TENSORS_MAX(model);
    dmrt_tensor_desc *descs = calloc(n, sizeof *descs);
    const void **data = calloc(n, sizeof *data);
    const dmrt_st_tensor **source = calloc(n, sizeof *source);
    char(*names)[256] = calloc(n, sizeof *names);
    float **copies = calloc(n, sizeof *copies);
    int rc = !descs || !data || !source || !names || !copies ? dmrt_errorf(err, errlen, "%s: out of memory", path) : 0;
    int inputs_at = 0;
    int count = rc ? 0 : quantized_tensors(model, ctx, descs, data, names, copies, 0, &inputs_at, err, errlen);
    if (count < 0) rc = -1;
    if (rc == 0) rc = check_quantized_file(model, ctx, &f, descs, count, inputs_at, source, err, errlen);
    for (int k = 0; rc == 0 && k < count; k++)
        memcpy((void *)data[k], source[k]->data, (size_t)descs[k].numel * dmrt_dtype_size(descs[k].dtype));
    if (put_copies(model, ctx, copies, rc == 0, err, errlen) != 0) rc = -1;
    /* the f32 copies, where a weight has one: what the products use, for --save and the
     * accessors (a weight held narrow only has none: gather dequantizes it); and the
     * products' own copy where it is another (the CUDA target's device copy) */
    for (int i = 0; rc == 0 && i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (!q) continue;
        if (q->narrow_only) {
            if (sync_qweight(model, ctx, i, err, errlen) != 0) rc = -1;
            continue;
        }
        float *copy, *w = param_on_host(model, ctx, i, 0, &copy, err, errlen);
        if (!w) rc = -1;
        else dmrt_dequantize_param(q, w);
        if (w && (put_param(model, ctx, i, copy, 1, err, errlen) != 0 || sync_qweight(model, ctx, i, err, errlen) != 0))
            rc = -1;
    }
    free(descs), free(data), free(source), free(names);
    dmrt_st_close(&f);
    return rc;
}

int dmrt_load_weights(const dmrt_model *model, void *ctx, const char *path, char *err, size_t errlen) {
    if (!model->quantize) return dmrt_load_params(model, ctx, path, err, errlen);
    int quantized = dmrt_is_quantized_file(path, err, errlen);
    if (quantized < 0) return -1;
    /* --quantize int8 also needs its products' input scales, which only the trainer's
     * calibration measures (and a --save-quantized file keeps): refused before anything changes */
    if (!quantized && dmrt_quantizes_activations(model))
        return dmrt_errorf(err, errlen, "%s: f32 weights; model '%s' (--quantize int8) also needs its products' input "
                           "scales: load a file that its trainer's --save-quantized wrote (docs/compression.md)",
                           path, model->name);
    return dmrt_load_init(model, ctx, path, err, errlen);
}

int dmrt_quant_ready(const dmrt_model *model, void *ctx, char *err, size_t errlen) {
    for (int i = 0; model->quantize && i < model->n_params; i++) {
        const dmrt_qweight *q = model->qweight(ctx, i);
        if (q && q->quantize_input && !q->calib && !(q->input_scale > 0.0f))
            return dmrt_errorf(err, errlen, "model '%s' (--quantize int8): '%s' has no calibrated input scale: load a "
                               "file that its trainer's --save-quantized wrote first (%s_load_weights)",
                               model->name, model->params[i].name, model->name);
    }
    return 0;
}

int dmrt_load_init(const dmrt_model *model, void *ctx, const char *path, char *err, size_t errlen) {
    int quantized = dmrt_is_quantized_file(path, err, errlen);
    if (quantized < 0) return -1;
    if (quantized && !model->quantize) {
        dmrt_st_file f;
        if (dmrt_st_read_meta(&f, path, err, errlen) != 0) return -1;
        const char *mode = dmrt_st_meta(&f, "dmc.quantize");
        dmrt_errorf(err, errlen, "%s: holds quantized weights (--quantize %s); model '%s' is an f32 program: compile it "
                    "with --quantize %s, or give it f32 weights", path, mode, model->name, mode);
        dmrt_st_close(&f);
        return -1;
    }
    if (quantized) return dmrt_load_quantized(model, ctx, path, err, errlen);
    if (dmrt_load_params(model, ctx, path, err, errlen) != 0) return -1;
    /* int8: the f32 weights stay for the calibration's f32 forward, which quantizes them
     * after (dmrt_calibration_end) */
    if (model->quantize && !dmrt_quantizes_activations(model) && dmrt_quantize_params(model, ctx, err, errlen) != 0)
        return -1;
    for (int i = 0; model->quantize && i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (q) q->input_scale = 0.0f; /* not calibrated: these weights are not theirs */
    }
    return 0;
}
