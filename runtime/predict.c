/* predict.c: the trainer's --predict (docs/trainer.md): the outputs of a model for the rows
 * of a batch file, written to a safetensors file. The model's predict (<model>_predict)
 * runs up to predict_batch rows at a time; every rank runs it (a collective) and world
 * rank 0 writes the file, atomically. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmrt.h"
#include "dmrt_comm.h"
#include "internal.h"
#include "trainer_guards.h"
#include "trainer_options.h"

/* Outputs that are not finite are not written (weights that overflow in the forward):
 * 0, or -1 naming the output, its row and the value. */
static int outputs_finite(const dmrt_model *m, const dmrt_tensor_desc *descs, void *const *outs, const char *out_path,
                          char *err, size_t errlen) {
    for (int i = 0; i < m->n_outputs; i++) {
        if (descs[i].dtype != DMRT_F32) continue;
        int64_t at = dmrt_first_non_finite(outs[i], descs[i].numel);
        if (at >= 0)
            return dmrt_errorf(err, errlen, "%s not written: output '%s' holds a non-finite value (%g in row %lld)", out_path,
                               descs[i].name, (double)((const float *)outs[i])[at],
                               (long long)(at / (descs[i].numel / descs[i].shape[0])));
    }
    return 0;
}

/* The file's tensor for every input predict reads: [N, the input's shape after its first
 * dim], the input's dtype, the same N for all. Returns N, or -1 with the message. */
static int64_t check_inputs(const dmrt_model *m, const dmrt_st_file *f, const dmrt_st_tensor **t, char *err, size_t errlen) {
    int64_t n = -1;
    const char *first = NULL;
    char want[300], got[300];
    for (int i = 0; i < m->n_inputs; i++) {
        const dmrt_tensor_desc *x = &m->inputs[i];
        if (!m->predict_reads[i]) continue;
        dmrt_shape_str(want, sizeof want, x->rank, x->shape);
        char *rest = strchr(want, ',');
        snprintf(got, sizeof got, "[rows%s", rest ? rest : "]");
        snprintf(want, sizeof want, "%s", got);
        t[i] = dmrt_st_find(f, x->name);
        if (!t[i])
            return dmrt_errorf(err, errlen, "%s: no tensor '%s' for model input %s (%s %s): predict needs one tensor per input it reads, named after it",
                               f->path, x->name, x->name, dmrt_dtype_name(x->dtype), want), -1;
        if (t[i]->dtype != x->dtype)
            return dmrt_errorf(err, errlen, "%s: tensor '%s': dtype %s but model input %s needs %s", f->path, x->name,
                               dmrt_dtype_name(t[i]->dtype), x->name, dmrt_dtype_name(x->dtype)), -1;
        if (t[i]->rank != x->rank || memcmp(t[i]->shape + 1, x->shape + 1, sizeof(int64_t) * (size_t)(x->rank - 1)) != 0)
            return dmrt_errorf(err, errlen, "%s: tensor '%s': shape %s but model input %s needs %s %s (any number of rows)",
                               f->path, x->name, dmrt_shape_str(got, sizeof got, t[i]->rank, t[i]->shape), x->name,
                               dmrt_dtype_name(x->dtype), want), -1;
        if (n >= 0 && t[i]->shape[0] != n)
            return dmrt_errorf(err, errlen, "%s: tensor '%s' has %lld rows but tensor '%s' has %lld", f->path, x->name,
                               (long long)t[i]->shape[0], first, (long long)n), -1;
        n = t[i]->shape[0], first = x->name;
    }
    if (n < 0) return dmrt_errorf(err, errlen, "%s: model '%s' reads no inputs to predict", f->path, m->name), -1;
    if (n == 0) return dmrt_errorf(err, errlen, "%s: tensor '%s' has no rows to predict", f->path, first), -1;
    return n;
}

/* The model's message about a call's rows (a bad id or target, at the row of the call's
 * batch: "id 300 at [2, 3] of 'tokens'", "target 12 of row 11") with that row made the
 * batch file's, the call's first being the file's row `start`; other messages as they are. */
static const char *file_rows(char *buf, size_t len, const char *msg, int64_t start) {
    static const char *const marks[] = {" at [", " of row "};
    for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
        const char *at = strstr(msg, marks[k]);
        if (!at) continue;
        const char *digits = at + strlen(marks[k]);
        char *end;
        long long row = strtoll(digits, &end, 10);
        if (end == digits || *digits < '0' || *digits > '9') continue;
        snprintf(buf, len, "%.*s%lld%s", (int)(digits - msg), msg, row + (long long)start, end);
        return buf;
    }
    return msg;
}

/* Runs predict over the n rows in chunks of the model's batch into outs (whole). Each
 * chunk's inputs are copied out of the file's buffer, where they may be unaligned. */
static int run_chunks(const dmrt_model *m, void *ctx, const char *path, const dmrt_st_tensor **t, int64_t n, void **outs,
                      char *err, size_t errlen) {
    const int64_t B = m->predict_batch;
    void **in = calloc((size_t)m->n_inputs + 1, sizeof *in);
    void **out = calloc((size_t)m->n_outputs + 1, sizeof *out);
    int status = in && out ? 0 : -1;
    for (int i = 0; status == 0 && i < m->n_inputs; i++)
        if (m->predict_reads[i] && !(in[i] = dmrt_alloc((size_t)m->inputs[i].numel * 4))) status = -1;
    if (status != 0) dmrt_errorf(err, errlen, "out of memory");
    for (int64_t start = 0; status == 0 && start < n; start += B) {
        int64_t rows = n - start < B ? n - start : B;
        for (int i = 0; i < m->n_inputs; i++) {
            size_t row = (size_t)(m->inputs[i].numel / B) * 4;
            if (m->predict_reads[i]) memcpy(in[i], (const char *)t[i]->data + (size_t)start * row, (size_t)rows * row);
        }
        for (int i = 0; i < m->n_outputs; i++)
            out[i] = (char *)outs[i] + (size_t)start * (size_t)(m->outputs[i].numel / B) * 4;
        if (m->predict(ctx, (const void *const *)in, rows, (void *const *)out) != DMRT_OK) {
            char at_file[1024];
            status = dmrt_errorf(err, errlen, "predict of rows %lld .. %lld of %s: %s", (long long)start,
                                 (long long)(start + rows - 1), path, file_rows(at_file, sizeof at_file, m->error(ctx), start));
        }
    }
    for (int i = 0; in && i < m->n_inputs; i++) dmrt_free(in[i]);
    free(in);
    free(out);
    return status;
}

/* The files an --init (and an int8 program's calibration) reads: the weights, and the data
 * of the calibration (a --data text: corpus, else Fashion-MNIST's files in --data-dir). The
 * calibration reads its data only when the weights are f32 ones; the data named is listed
 * either way (an output over it is refused, not only when it would be read). */
static void init_files(dmrt_run_files *fs, const dmrt_model *m, const dmrt_init_opts *io) {
    dmrt_run_files_read(fs, "--init", "the --init file", "the weights", io->init);
    if (m->quantize && dmrt_quantizes_activations(m))
        dmrt_run_files_data(fs, io->text, io->text ? NULL : io->data_dir ? io->data_dir : DMRT_TRAINER_DEFAULT_DATA_DIR);
}

/* The one file `option` writes (holding `holds`) must not replace what the run reads: the
 * inputs (a batch file), the weights, the calibration's data. 0, or -1 with the message. */
static int output_distinct(const dmrt_model *m, const dmrt_init_opts *io, const char *batch_file, const char *option,
                           const char *holds, const char *path, char *err, size_t errlen) {
    dmrt_run_files fs = {0};
    dmrt_run_files_read(&fs, "--batch-file", "the --batch-file", "the inputs", batch_file);
    init_files(&fs, m, io);
    /* (the one output: never named second) */
    dmrt_run_files_write(&fs, option, NULL, option, holds, path);
    int rc = dmrt_run_files_check(&fs, NULL, err, errlen);
    dmrt_run_files_free(&fs);
    return rc;
}

/* Checks, creates, loads, predicts and writes; 0 or -1 with the message. */
static int predict_file(const dmrt_model *m, uint64_t seed, const dmrt_init_opts *io, const char *batch_file,
                        const char *out_path, int threads, dmrt_rank *rank, FILE *errs, int quiet, char *err,
                        size_t errlen) {
    dmrt_st_file f;
    memset(&f, 0, sizeof f);
    const dmrt_st_tensor **t = calloc((size_t)m->n_inputs + 1, sizeof *t);
    void **outs = calloc((size_t)m->n_outputs + 1, sizeof *outs);
    dmrt_tensor_desc *descs = calloc((size_t)m->n_outputs + 1, sizeof *descs);
    void *ctx = NULL;
    int status = -1;
    int64_t n = 0;
    if (!t || !outs || !descs) {
        dmrt_errorf(err, errlen, "out of memory");
        goto done;
    }
    if (output_distinct(m, io, batch_file, "--out", "the outputs", out_path, err, errlen) != 0 ||
        dmrt_st_read(&f, batch_file, err, errlen) != 0 ||
        (n = check_inputs(m, &f, t, err, errlen)) < 0 ||
        dmrt_trainer_guard_writable("--out", out_path, err, errlen) != 0)
        goto done;
    for (int i = 0; i < m->n_outputs; i++) {
        descs[i] = m->outputs[i];
        descs[i].shape[0] = n;
        descs[i].numel = m->outputs[i].numel / m->predict_batch * n;
        if (!(outs[i] = malloc((size_t)descs[i].numel * 4 + 4))) {
            dmrt_errorf(err, errlen, "out of memory");
            goto done;
        }
    }
    ctx = rank ? m->create_rank(seed, rank, err, errlen) : m->create(seed, err, errlen);
    if (!ctx || (threads && dmrt_trainer_set_threads(m, ctx, threads, err, errlen) != 0) ||
        dmrt_trainer_init_params(m, ctx, io, err, errlen) != 0)
        goto done;
    double t0 = dmrt_now();
    if (run_chunks(m, ctx, batch_file, t, n, outs, err, errlen) != 0 || outputs_finite(m, descs, outs, out_path, err, errlen) != 0)
        goto done;
    int lead = !rank || dmrt_rank_id(rank) == 0;
    if (lead && dmrt_st_write(out_path, m->n_outputs, descs, (const void *const *)outs, err, errlen) != 0) goto done;
    if (!quiet) {
        long long calls = (long long)((n + m->predict_batch - 1) / m->predict_batch);
        fprintf(errs, "predicted %lld rows (%lld call%s of up to %lld) in %.3f s: %s\n", (long long)n, calls,
                calls == 1 ? "" : "s", (long long)m->predict_batch, dmrt_now() - t0, out_path);
    }
    status = 0;
done:
    if (ctx) m->destroy(ctx);
    for (int i = 0; outs && i < m->n_outputs; i++) free(outs[i]);
    free(outs);
    free(descs);
    free(t);
    dmrt_st_close(&f);
    return status;
}

/* The trainer's --predict, for one rank (rank NULL: serial). Returns the trainer's exit
 * status: 0, 1 (runtime error: reported, or for a rank in fail and the rank aborted). */
int dmrt_trainer_predict(const dmrt_model *m, uint64_t seed, const dmrt_init_opts *io, const char *batch_file,
                         const char *out, int threads, const char *prog, dmrt_rank *rank, char *fail, size_t faillen) {
    char err[2048] = "";
    int lead = !rank || dmrt_rank_id(rank) == 0;
    FILE *errs = lead ? stderr : NULL;
    if (!m->predict || m->predict_batch <= 0 || !m->predict_reads) {
        dmrt_errorf(err, sizeof err, "model '%s' cannot predict: %s", m->name,
                    m->predict_unsupported ? m->predict_unsupported : "it has no predict entry");
    } else if (predict_file(m, seed, io, batch_file, out, threads, rank, errs, io->quiet || !lead, err, sizeof err) == 0) {
        return 0;
    }
    if (rank) {
        snprintf(fail, faillen, "%s", err);
        dmrt_rank_abort(rank, fail);
    } else {
        fprintf(stderr, "%s: error: %s\n", prog, err);
    }
    return 1;
}

/* The trainer's --save-quantized (a serial quantized program): the narrow weights of --init's
 * parameters (or of the initial ones) into path. Returns the trainer's exit status. */
int dmrt_trainer_save_quantized(const dmrt_model *m, uint64_t seed, const dmrt_init_opts *io, const char *path,
                                int threads, const char *prog) {
    char err[2048] = "";
    void *ctx = m->create(seed, err, sizeof err);
    /* threads: the int8 calibration's f32 forward runs on them */
    int ok = ctx && (!threads || dmrt_trainer_set_threads(m, ctx, threads, err, sizeof err) == 0) &&
             output_distinct(m, io, NULL, "--save-quantized", "the quantized weights", path, err, sizeof err) == 0 &&
             dmrt_trainer_guard_writable("--save-quantized", path, err, sizeof err) == 0 &&
             dmrt_trainer_init_params(m, ctx, io, err, sizeof err) == 0 &&
             dmrt_save_quantized(m, ctx, path, err, sizeof err) == 0;
    if (ctx) m->destroy(ctx);
    if (!ok) {
        fprintf(stderr, "%s: error: %s\n", prog, err);
        return 1;
    }
    if (!io->quiet) fprintf(stderr, "wrote the weights of --quantize %s to %s\n", m->quantize, path);
    return 0;
}
