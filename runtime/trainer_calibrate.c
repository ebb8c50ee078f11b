/* trainer_calibrate.c: --init for the trainer's paths (training, --evaluate, --predict,
 * --save-quantized), and for a --quantize int8 program given f32 weights the calibration
 * of its products' input scales: the first --calibrate N rows of the Fashion-MNIST
 * training images, in the files' order (not shuffled), or for a byte-level language model
 * the first N windows of --data text's training part (T+1 bytes starting T bytes apart:
 * window k at byte k T), through its f32 forward, in batches of the model's B (the last one
 * padded with zero rows, which are not recorded). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "internal.h"
#include "trainer_data.h"
#include "trainer_options.h"
#include "trainer_run.h"

#define DEFAULT_CALIBRATION_ROWS 512

/* Row r (of the calibration's, counted from 0) of d's training data into row `row` of the
 * inputs in: a Fashion-MNIST image and its label, or (text) the window at byte r T, its
 * bytes as tokens and the next ones as targets. */
static void fill_row(const tr_data *d, int text, void **in, int64_t row, int64_t r) {
    if (!text) {
        memcpy((float *)in[0] + row * TR_MNIST_PIXELS, d->train_x.images + r * TR_MNIST_PIXELS,
               TR_MNIST_PIXELS * sizeof(float));
        ((int32_t *)in[1])[row] = d->train_y.labels[r];
        return;
    }
    const int64_t T = d->lm.len;
    const unsigned char *window = d->corpus.bytes + r * T;
    int32_t *tokens = (int32_t *)in[d->lm.tokens] + row * T, *targets = (int32_t *)in[d->lm.targets] + row * T;
    for (int64_t t = 0; t < T; t++) tokens[t] = window[t], targets[t] = window[t + 1];
}

/* Runs the calibration rows [0, rows) of d through the forward in batches of the model's B
 * (the last padded with zero rows, which the records leave out), their |x| recorded. */
static int calibration_forwards(const dmrt_model *m, void *ctx, const tr_data *d, int text, int64_t rows, char *err,
                                size_t errlen) {
    const int64_t B = text ? d->lm.batch : d->batch;
    void *in[2] = {NULL, NULL};
    size_t bytes[2];
    int status = 0;
    for (int i = 0; i < 2; i++) {
        bytes[i] = dmrt_trainer_desc_bytes(&m->inputs[i]);
        if (!(in[i] = dmrt_alloc(bytes[i]))) status = dmrt_errorf(err, errlen, "calibration: out of memory");
    }
    for (int64_t start = 0; status == 0 && start < rows; start += B) {
        int64_t cnt = rows - start < B ? rows - start : B;
        for (int i = 0; i < 2; i++) memset(in[i], 0, bytes[i]);
        for (int64_t row = 0; row < cnt; row++) fill_row(d, text, in, row, start + row);
        dmrt_calibration_count_rows(m, ctx, cnt, B);
        float loss = 0.0f;
        if (m->forward(ctx, (const void *const *)in, &loss) != 0)
            status = dmrt_errorf(err, errlen, "calibration (training %s %lld..%lld): %s", text ? "windows" : "rows",
                                 (long long)start, (long long)(start + cnt - 1), dmrt_trainer_ctx_error(m, ctx));
    }
    for (int i = 0; i < 2; i++) dmrt_free(in[i]);
    return status;
}

/* The data a calibration reads, opened into d: Fashion-MNIST's training rows, or (*text)
 * a language model's --data text windows. Checks that `rows` of them exist. */
static int calibration_data(const dmrt_model *m, const dmrt_init_opts *io, int64_t rows, tr_data *d, int *text,
                            const char **source, char *err, size_t errlen) {
    int64_t B = dmrt_trainer_mnist_batch(m);
    tr_lm lm;
    char why[256];
    *text = B <= 0 && io->text && dmrt_trainer_find_lm(m, &lm, why, sizeof why) == 0;
    if ((B <= 0 && !*text) || !m->forward) {
        char ins[1024];
        return dmrt_errorf(err, errlen, "--quantize int8 calibrates its input scales on Fashion-MNIST's training rows, "
                           "or a language model's on --data text:FILES, neither of which model '%s' (inputs %s) has "
                           "here: give --init a file that --save-quantized wrote for it%s", m->name,
                           dmrt_trainer_inputs_str(ins, sizeof ins, m), io->text ? "" : " (or --data text:FILES)");
    }
    /* a model with Fashion-MNIST's inputs calibrates on its rows: --data text would be ignored */
    if (B > 0 && io->text)
        return dmrt_errorf(err, errlen, "--data text:%s: model '%s' calibrates on Fashion-MNIST's training rows "
                           "(--data-dir), not on a text corpus (a byte-level language model's)", io->text, m->name);
    if (*text) {
        *source = io->text;
        if (dmrt_trainer_open_text(d, &lm, io->text, 0, err, errlen) != 0) return -1;
        int64_t windows = (d->train_bytes - 1) / lm.len; /* window k needs bytes k T .. k T + T */
        if (rows > windows)
            return dmrt_errorf(err, errlen, "--calibrate %lld: the training part of %s holds only %lld windows of T+1 = "
                               "%lld bytes, T apart", (long long)rows, io->text, (long long)windows,
                               (long long)(lm.len + 1));
        return 0;
    }
    *source = io->data_dir ? io->data_dir : DMRT_TRAINER_DEFAULT_DATA_DIR;
    if (dmrt_trainer_open_mnist(d, B, *source, 0, err, errlen) != 0) return -1;
    if (rows > d->train_x.n)
        return dmrt_errorf(err, errlen, "--calibrate %lld: %s has only %lld training rows", (long long)rows, *source,
                           (long long)d->train_x.n);
    return 0;
}

static int calibrate(const dmrt_model *m, void *ctx, const dmrt_init_opts *io, char *err, size_t errlen) {
    int64_t rows = io->calibrate ? io->calibrate : DEFAULT_CALIBRATION_ROWS;
    tr_data d;
    memset(&d, 0, sizeof d);
    const char *dir = NULL;
    int text = 0;
    int status = calibration_data(m, io, rows, &d, &text, &dir, err, errlen);
    double t0 = dmrt_now();
    if (status == 0) status = dmrt_calibration_begin(m, ctx, io->percentile, err, errlen);
    if (status == 0) {
        status = calibration_forwards(m, ctx, &d, text, rows, err, errlen);
        /* ends even after a failed forward: the records are freed */
        char end_err[512];
        if (dmrt_calibration_end(m, ctx, end_err, sizeof end_err) != 0 && status == 0)
            status = dmrt_errorf(err, errlen, "%s", end_err);
    }
    if (status == 0 && !io->quiet) {
        char how[64] = "min-max";
        if (io->percentile > 0) snprintf(how, sizeof how, "percentile %g", io->percentile);
        fprintf(stderr, "calibrated the int8 input scales on %lld training %s of %s (%s) in %.2f s\n", (long long)rows,
                text ? "windows" : "rows", dir, how, dmrt_now() - t0);
    }
    dmrt_trainer_data_close(&d);
    return status;
}

/* Whether every product of m has its input scale (read from a --save-quantized file). */
static int calibrated(const dmrt_model *m, void *ctx) {
    for (int i = 0; i < m->n_params; i++) {
        const dmrt_qweight *q = m->qweight(ctx, i);
        if (q && q->quantize_input && !(q->input_scale > 0.0f)) return 0;
    }
    return 1;
}

int dmrt_trainer_init_params(const dmrt_model *m, void *ctx, const dmrt_init_opts *io, char *err, size_t errlen) {
    if (io->init && dmrt_load_init(m, ctx, io->init, err, errlen) != 0) return -1;
    if (!dmrt_quantizes_activations(m)) return 0;
    if (!calibrated(m, ctx)) return calibrate(m, ctx, io, err, errlen);
    if (io->calibrate || io->percentile > 0)
        return dmrt_errorf(err, errlen, "%s holds calibrated input scales (--save-quantized wrote it): --calibrate and "
                           "--calibrate-percentile apply to f32 weights", io->init);
    return 0;
}
