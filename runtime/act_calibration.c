/* act_calibration.c: the input scales of a --quantize int8 program's products (dmrt.h,
 * dmrt_calibration_begin), from the |x| its f32 forward feeds each quantized product while
 * a calibration runs: the largest (min-max), or all of them for a percentile. */
#include "dmrt.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dmrt_act_stats {
    float amax;
    double percentile; /* 0: min-max */
    float *values;     /* with a percentile: every |x| recorded */
    size_t n, cap;
    int64_t used, of;  /* the batch's real rows, of its rows */
    int out_of_memory;
};

int dmrt_quantizes_activations(const dmrt_model *model) {
    return model->quantize && strcmp(model->quantize, "int8") == 0;
}

static int grow(struct dmrt_act_stats *st, size_t more) {
    if (st->n + more <= st->cap) return 0;
    size_t cap = st->cap ? st->cap : 1 << 16;
    while (cap < st->n + more) cap *= 2;
    float *v = realloc(st->values, cap * sizeof *v);
    if (!v) return -1;
    st->values = v, st->cap = cap;
    return 0;
}

void dmrt_act_stats_record(struct dmrt_act_stats *st, int64_t m, const float *a, int64_t lda, int64_t k) {
    /* a product of a batch of `of` examples has m / of rows per example (1 in an MLP, T for
     * [B, T, C] activations): the padding examples' rows are the last ones */
    int64_t rows = st->of > 0 && m % st->of == 0 ? m / st->of * st->used : m;
    if (st->percentile > 0 && !st->out_of_memory && grow(st, (size_t)(rows * k)) != 0) st->out_of_memory = 1;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t p = 0; p < k; p++) {
            float v = fabsf(a[i * lda + p]);
            st->amax = fmaxf(st->amax, v);
            if (st->percentile > 0 && !st->out_of_memory) st->values[st->n++] = v;
        }
}

int dmrt_calibration_begin(const dmrt_model *model, void *ctx, double percentile, char *err, size_t errlen) {
    for (int i = 0; i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (!q || !q->quantize_input) continue;
        if (!(q->calib = calloc(1, sizeof *q->calib))) {
            for (int j = 0; j < i; j++) {
                dmrt_qweight *r = model->qweight(ctx, j);
                if (r && r->calib) free(r->calib), r->calib = NULL;
            }
            return dmrt_errorf(err, errlen, "calibration: out of memory");
        }
        q->calib->percentile = percentile;
    }
    return 0;
}

void dmrt_calibration_count_rows(const dmrt_model *model, void *ctx, int64_t used, int64_t of) {
    for (int i = 0; i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (q && q->calib) q->calib->used = used, q->calib->of = of;
    }
}

static int compare_floats(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* amax of st: the largest |x|, or the sorted values' floor(P / 100 * (n - 1))-th. */
static float stats_amax(struct dmrt_act_stats *st) {
    if (st->percentile <= 0 || st->n == 0) return st->amax;
    qsort(st->values, st->n, sizeof *st->values, compare_floats);
    size_t at = (size_t)floor((double)(st->n - 1) * (st->percentile / 100.0));
    return st->values[at < st->n ? at : st->n - 1];
}

int dmrt_calibration_end(const dmrt_model *model, void *ctx, char *err, size_t errlen) {
    int failed = 0;
    for (int i = 0; i < model->n_params; i++) {
        dmrt_qweight *q = model->qweight(ctx, i);
        if (!q || !q->calib) continue;
        if (q->calib->out_of_memory) {
            failed = dmrt_errorf(err, errlen, "calibration of '%s': out of memory for the |x| a percentile sorts "
                                 "(calibrate fewer rows)", model->params[i].name);
        } else {
            float amax = stats_amax(q->calib);
            /* an infinite |x| (the f32 forward overflowed on the calibration rows) would make
             * the scale inf: every x quantized to 0, and a --save-quantized file its loader
             * refuses; a NaN |x| reaches amax only through a percentile's sort */
            if (!isfinite(amax) && !failed) /* the first product's: the later ones follow from it */
                failed = dmrt_errorf(err, errlen, "calibration of '%s': the input of its product holds %s on the "
                                     "calibration rows (the f32 forward overflows with these weights), so "
                                     "it has no finite input scale", model->params[i].name,
                                     isnan(amax) ? "NaN" : "an infinite value");
            else if (isfinite(amax))
                q->input_scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        }
        free(q->calib->values);
        free(q->calib);
        q->calib = NULL;
    }
    if (failed) return -1;
    return dmrt_quantize_params(model, ctx, err, errlen);
}
