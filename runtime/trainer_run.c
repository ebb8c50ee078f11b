/* trainer_run.c: one rank's run of the trainer (docs/trainer.md), in the phases run() calls
 * in order: which data the model takes, --resume's checkpoint, the output paths tried, the
 * data opened, the model created (and loaded), the steps counted, the step loop, the end
 * of training (drain, final checkpoint, a stop), and what a finished run writes and prints.
 * Each phase returns a TR_ status; a TR_RUNTIME one leaves its message in the run's err. */
#include "trainer_run.h"
#include "trainer_checkpoint.h"
#include "trainer_data.h"
#include "trainer_guards.h"
#include "trainer_options.h"
#include "trainer_output.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TR_DEFAULT_DATA_DIR DMRT_TRAINER_DEFAULT_DATA_DIR

/* sum += to - from */
static void blas_add(dmrt_blas_time *sum, dmrt_blas_time from, dmrt_blas_time to) {
    sum->seconds += to.seconds - from.seconds;
    sum->flops += to.flops - from.flops;
    sum->calls += to.calls - from.calls;
}

int dmrt_trainer_set_threads(const dmrt_model *m, void *ctx, int threads, char *err, size_t errlen) {
    if (!m->set_threads) {
        snprintf(err, errlen, "model '%s' was generated before --threads existed: regenerate it with dmc", m->name);
        return -1;
    }
    if (m->set_threads(ctx, threads) != DMRT_OK) {
        snprintf(err, errlen, "%s", dmrt_trainer_ctx_error(m, ctx));
        return -1;
    }
    return 0;
}


/* ---- model inspection ------------------------------------------------------------------------ */

/* Inputs f32[B, 784] and i32[B]: B, else 0. */
int64_t dmrt_trainer_mnist_batch(const dmrt_model *m) {
    if (m->n_inputs != 2) return 0;
    const dmrt_tensor_desc *x = &m->inputs[0], *y = &m->inputs[1];
    if (x->dtype != DMRT_F32 || x->rank != 2 || x->shape[1] != TR_MNIST_PIXELS) return 0;
    if (y->dtype != DMRT_I32 || y->rank != 1 || y->shape[0] != x->shape[0]) return 0;
    return x->shape[0];
}

/* The output holding logits f32[B, 10], preferring one named "logits"; -1 if none. */
static int logits_output(const dmrt_model *m, int64_t batch) {
    int found = -1;
    for (int i = 0; i < m->n_outputs; i++) {
        const dmrt_tensor_desc *d = &m->outputs[i];
        if (d->dtype != DMRT_F32 || d->rank != 2 || d->shape[0] != batch ||
            d->shape[1] != TR_MNIST_CLASSES)
            continue;
        if (d->name && strcmp(d->name, "logits") == 0) return i;
        if (found < 0) found = i;
    }
    return found;
}


/* ---- one rank's run: its state, and the phases run() calls in order ------------------------ */

/* What a run holds from phase to phase. */
typedef struct tr_run {
    const dmrt_model *m;
    const tr_opts *o;          /* the options; a resumed run's copy (resumed_opts) holds its checkpoint's seed */
    tr_opts resumed_opts;
    const char *prog;
    dmrt_rank *rank;           /* NULL: the serial model */
    int lead;                  /* world rank 0: the one that prints and writes */
    FILE *outs, *errs;         /* stdout and stderr on the lead, /dev/null (devnull) elsewhere */
    FILE *devnull;
    char err[2048];            /* the message of a TR_RUNTIME failure */
    tr_data d;
    tr_lm lm;                  /* the byte-level language model's inputs and output (is_lm) */
    int is_lm;
    int64_t batch;             /* Fashion-MNIST's B (inputs f32[B, 784] and i32[B]), else 0 */
    void *ctx;
    void **in;                 /* the step's inputs, one buffer each */
    dmrt_st_file resume_file;  /* --resume's checkpoint, until its tensors are in ctx */
    int resumed;               /* resume_file is open */
    char resumed_from[4096];
    char resume_adapted[1024]; /* what loading the checkpoint did otherwise than as it holds (dmrt_checkpoint_adapted) */
    int64_t resumed_total;     /* the steps the checkpoint's run was to train (0: unknown) */
    const char *data_kind;     /* fashion-mnist, text, batch-file or none (the checkpoints' trainer.data) */
    char data_hash[17];        /* what the run trains on (trainer.data_hash), with --checkpoint or --resume */
    char run_id[DMRT_RUN_ID_SIZE]; /* the run's identity (trainer.run): its checkpoint's when resumed */
    int eval_out;              /* the logits output for the test accuracy, or -1 */
    int threads;
    int64_t start, total;      /* steps done before this run (--resume), steps the run ends after */
    int64_t step, checkpointed; /* steps done; the step of the last checkpoint written (-1: none) */
    int stop;                  /* a signal asked every rank to stop */
    int stepping;              /* between dmrt_trainer_guard_stepping(1) and (0): from the first
                                * step to --save written, a signal waits for a step boundary */
    double *step_seconds;      /* --trace: every step's time, for the median beside the prediction */
    tr_bar bar;
    double t_train, t_steps, acc, val_loss;
    int acc_fresh, val_fresh;  /* acc, val_loss are for the current parameters */
    float last_loss;           /* the last step's, for the progress bar */
    int blas_on;
    dmrt_blas_time blas;       /* what the train_step calls spent in dmrt_sgemm */
    char checkpoint_failed[2048]; /* the error of the final checkpoint, reported after --save */
    int checkpoint_lock;       /* the lead's lock of --checkpoint's directory for the whole run, or -1 */
} tr_run;

/* A failure of phase code: the message into r->err, TR_RUNTIME. */
static int run_failed(tr_run *r, const char *fmt, ...) DMRT_PRINTF(2, 3);
static int run_failed(tr_run *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return TR_RUNTIME;
}

/* Writes the checkpoint of the current step into --checkpoint's directory and says so on
 * stdout ("checkpoint <step> <path>"). The data's position follows from the step, the seed
 * and the data, which the metadata records with the run's identity. Every rank calls it. */
static int write_checkpoint(tr_run *r) {
    const tr_opts *o = r->o;
    char seed[32], total[32], path[4096], inputs[DMRT_INPUTS_META_SIZE];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    snprintf(total, sizeof total, "%lld", (long long)r->total);
    dmrt_trainer_inputs_meta(inputs, sizeof inputs, r->m);
    /* a run resumed from a checkpoint without a run has none (the last key) */
    const char *keys[] = {"trainer.seed", "trainer.data", "trainer.total_steps", "trainer.data_hash",
                          "trainer.data_source", DMRT_CKPT_INPUTS_KEY, DMRT_CKPT_RUN_KEY},
               *values[] = {seed, r->data_kind, total, r->data_hash, r->d.source ? r->d.source : "", inputs, r->run_id};
    if (dmrt_trainer_checkpoint_write(r->m, r->ctx, o->checkpoint, o->checkpoint_keep, r->run_id[0] ? r->run_id : NULL,
                                      r->lead, r->run_id[0] ? 7 : 6, keys, values, path, sizeof path, r->err,
                                      sizeof r->err) != 0)
        return TR_RUNTIME;
    fprintf(r->outs, "checkpoint %lld %s\n", (long long)r->m->step(r->ctx), path);
    fflush(r->outs);
    return TR_OK;
}

/* Which data the model can take, decided before anything is read: usage errors. */
static int choose_data(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    char ins[1024], outputs[1024], why[256];
    r->is_lm = dmrt_trainer_find_lm(m, &r->lm, why, sizeof why) == 0;
    if ((o->text_files || o->sample >= 0) && !r->is_lm) {
        fprintf(r->errs,
                "%s: %s needs a byte-level language model: inputs tokens: i32[B, T] and "
                "targets: i32[B, T], and an output logits: f32[B, T, V] with V >= 256; model "
                "'%s' has inputs %s and outputs %s (%s)\n",
                r->prog, o->text_files ? "--data text:..." : "--sample", m->name,
                dmrt_trainer_inputs_str(ins, sizeof ins, m),
                dmrt_trainer_descs_str(outputs, sizeof outputs, m->n_outputs, m->outputs), why);
        return TR_USAGE;
    }
    r->batch = dmrt_trainer_mnist_batch(m);
    /* Sampling from parameters given by --init needs no corpus. */
    int sample_only = o->sample >= 0 && (o->steps == 0 || o->epochs == 0) && !o->batch_file && !o->data && !o->data_dir;
    if (!o->batch_file && !o->text_files && r->batch <= 0 && !sample_only) {
        dmrt_trainer_inputs_str(ins, sizeof ins, m);
        if (o->data || o->data_dir)
            fprintf(r->errs,
                    "%s: %s needs a model with inputs f32[B, 784] and i32[B]; "
                    "model '%s' has inputs %s\n",
                    r->prog, o->data ? "--data fashion-mnist" : "--data-dir (Fashion-MNIST)", m->name, ins);
        else if (r->is_lm)
            fprintf(r->errs,
                    "%s: model '%s' (inputs %s) needs data: pass --data text:FILE[,FILE...] (a "
                    "corpus of bytes), or --batch-file FILE.safetensors with one tensor per "
                    "input, named after it, with a leading step dimension\n",
                    r->prog, m->name, ins);
        else
            fprintf(r->errs,
                    "%s: model '%s' (inputs %s) has no default data set; pass --batch-file "
                    "FILE.safetensors with one tensor per input, named after it, with a leading "
                    "step dimension\n",
                    r->prog, m->name, ins);
        return TR_USAGE;
    }
    if (!(r->rank ? m->create_rank != NULL : m->create != NULL) || !m->destroy || !m->param || !m->train_step)
        return run_failed(r, "model '%s' lacks create/destroy/param/train_step", m->name);
    if ((o->text_files || o->sample >= 0) && (!m->forward || !m->output))
        return run_failed(r, "model '%s' lacks forward/output, which %s needs", m->name,
                          o->text_files ? "the validation loss" : "sampling");
    return TR_OK;
}

/* --resume: its checkpoint first, as its seed orders the data and draws the dropout masks. */
static int open_resume(tr_run *r) {
    const tr_opts *o = r->o;
    if (!o->resume) return TR_OK;
    if (dmrt_trainer_resume_read(o->resume, &r->resume_file, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    r->resumed = 1;
    /* the data's position follows from the step and the inputs' sizes: checked before any is read */
    if (dmrt_trainer_resume_check_inputs(&r->resume_file, r->m, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    uint64_t seed = o->seed;
    int has_seed = dmrt_trainer_meta_u64(&r->resume_file, "trainer.seed", &seed, r->err, sizeof r->err);
    if (has_seed < 0) return TR_RUNTIME;
    if (has_seed && o->seed_given && seed != o->seed) {
        fprintf(r->errs, "%s: --seed %llu, but checkpoint %s was trained with seed %llu: a resumed run keeps its seed "
                         "(leave --seed out)\n", r->prog, (unsigned long long)o->seed, r->resume_file.path,
                (unsigned long long)seed);
        return TR_USAGE;
    }
    r->resumed_opts = *o;
    r->resumed_opts.seed = seed;
    r->o = &r->resumed_opts;
    return TR_OK;
}

/* No file the run writes is one it reads (the weights of --init, the --resume checkpoint,
 * the data), nor another it writes, nor a checkpoint of --checkpoint's directory: each
 * would be lost (--save over --init's weights, over the --batch-file; --dump-grads over
 * --save). picture: --trace's (NULL without --trace). */
static int outputs_distinct(tr_run *r, const char *picture) {
    const tr_opts *o = r->o;
    dmrt_run_files fs = {0};
    dmrt_run_files_read(&fs, "--init", "the --init file", "the weights", o->init);
    if (r->resumed) dmrt_run_files_resumed(&fs, r->resume_file.path);
    dmrt_run_files_read(&fs, "--batch-file", "the --batch-file", "the inputs", o->batch_file);
    /* the data open_data reads: a batch file, else a corpus, else Fashion-MNIST's files */
    int mnist = !o->batch_file && !o->text_files && r->batch > 0;
    dmrt_run_files_data(&fs, o->batch_file ? NULL : o->text_files,
                        mnist ? o->data_dir ? o->data_dir : TR_DEFAULT_DATA_DIR : NULL);
    dmrt_run_files_write(&fs, "--save", NULL, "the --save file", "the trained weights", o->save);
    dmrt_run_files_write(&fs, "--dump-grads", NULL, "the --dump-grads file", "the gradients", o->dump_grads);
    dmrt_run_files_write(&fs, "--trace", NULL, "the --trace file", "the trace", o->trace);
    dmrt_run_files_write(&fs, "--trace", "--trace's picture", "--trace's picture", "the trace's picture", picture);
    int rc = dmrt_run_files_check(&fs, o->checkpoint, r->err, sizeof r->err);
    dmrt_run_files_free(&fs);
    return rc == 0 ? TR_OK : TR_RUNTIME;
}

/* The run's identity, and what training will write, tried before it starts (only the lead
 * rank writes): distinct files, --checkpoint's directory (locked for the run), and a file
 * beside each output. */
static int probe_outputs(tr_run *r) {
    const tr_opts *o = r->o;
    /* the run's identity: its checkpoint's when resumed; its checkpoints go where no other run's are */
    dmrt_trainer_run_id(r->resumed ? &r->resume_file : NULL, r->run_id);
    const char *adopted = r->resumed && !r->run_id[0] ? r->resume_file.path : NULL; /* resumed from one without a run */
    if (!r->lead) return TR_OK;
    char picture[4096], picture_option[4200];
    if (o->trace) {
        dmrt_trace_picture_path(o->trace, picture, sizeof picture);
        snprintf(picture_option, sizeof picture_option, "--trace %s: its picture", o->trace);
    }
    if (outputs_distinct(r, o->trace ? picture : NULL) != TR_OK) return TR_RUNTIME;
    /* the checkpoint's step (its file's number); a bad one is the load's to report, below */
    uint64_t resumed_step = 0;
    char unused[256], note[3000];
    int has_step = r->resumed && dmrt_trainer_meta_u64(&r->resume_file, "dmc.step", &resumed_step, unused, sizeof unused) > 0;
    if (o->checkpoint) {
        int rc = dmrt_trainer_checkpoint_dir(o->checkpoint, r->run_id[0] ? r->run_id : NULL, adopted,
                                             has_step ? (int64_t)resumed_step : -1, &r->checkpoint_lock, note,
                                             sizeof note, r->err, sizeof r->err);
        if (note[0]) fprintf(r->errs, "%s: note: %s\n", r->prog, note);
        if (rc != 0) return TR_RUNTIME;
    }
    const char *options[] = {"--save", "--dump-grads", "--trace", picture_option},
               *paths[] = {o->save, o->dump_grads, o->trace, o->trace ? picture : NULL};
    for (int i = 0; i < 4; i++)
        if (paths[i] && dmrt_trainer_guard_writable(options[i], paths[i], r->err, sizeof r->err) != 0) return TR_RUNTIME;
    return TR_OK;
}

/* The data (a batch file, a text corpus or Fashion-MNIST), checked against a resumed run's. */
static int open_data(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    tr_data *d = &r->d;
    if (o->batch_file) {
        if (dmrt_trainer_open_batch_file(d, m, o->batch_file, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    } else if (o->text_files) {
        if (dmrt_trainer_open_text(d, &r->lm, o->text_files, o->seed, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    } else if (r->batch > 0) {
        const char *dir = o->data_dir ? o->data_dir : TR_DEFAULT_DATA_DIR;
        if (dmrt_trainer_open_mnist(d, r->batch, dir, o->seed, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    } /* else sampling only: no data, no steps */
    r->data_kind = d->mnist ? "fashion-mnist" : d->text ? "text" : o->batch_file ? "batch-file" : "none";
    /* a checkpoint records what its run trained on; a resumed run must train on the same. The
     * lead rank writes checkpoints and checks (its failure stops the others, as the probes') */
    if (r->lead && (o->checkpoint || r->resumed)) dmrt_trainer_data_hash(d, m, r->data_hash);
    if (r->lead && r->resumed) {
        char note[6000];
        if (dmrt_trainer_resume_check_data(&r->resume_file, r->data_kind, d->source, r->data_hash, note, sizeof note,
                                           r->err, sizeof r->err) != 0)
            return TR_RUNTIME;
        if (note[0]) fprintf(r->errs, "%s: note: %s\n", r->prog, note);
    }
    r->eval_out = -1;
    if (d->mnist) {
        if (!m->forward || !m->output)
            fprintf(r->errs, "%s: note: model '%s' has no forward/output; no test accuracy\n", r->prog, m->name);
        else if ((r->eval_out = logits_output(m, r->batch)) < 0)
            fprintf(r->errs, "%s: note: model '%s' has no output f32[%lld, 10] (logits); no test accuracy\n", r->prog,
                    m->name, (long long)r->batch);
    }
    if (o->evaluate && r->eval_out < 0 && !d->text)
        return run_failed(r, "--evaluate: model '%s' on %s data has nothing to evaluate (a test accuracy needs "
                          "fashion-mnist and an output f32[B, 10]; a validation loss needs --data text:FILES)",
                          m->name, r->data_kind);
    return TR_OK;
}

/* The inputs' buffers and the context, with its threads and the parameters of --init or
 * the checkpoint --resume names. */
static int create_model(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    if (!(r->in = calloc((size_t)m->n_inputs + 1, sizeof *r->in))) return run_failed(r, "out of memory");
    for (int i = 0; i < m->n_inputs; i++)
        if (!(r->in[i] = dmrt_alloc(dmrt_trainer_desc_bytes(&m->inputs[i])))) return run_failed(r, "out of memory");
    r->ctx = r->rank ? m->create_rank(o->seed, r->rank, r->err, sizeof r->err) : m->create(o->seed, r->err, sizeof r->err);
    if (!r->ctx) return r->err[0] ? TR_RUNTIME : run_failed(r, "creating model '%s' failed", m->name);
    r->threads = o->threads ? (int)o->threads : dmrt_threads_per_rank(r->rank ? dmrt_rank_local_count(r->rank) : 1);
    if (o->threads && dmrt_trainer_set_threads(m, r->ctx, r->threads, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    dmrt_init_opts io = dmrt_trainer_init_opts(o);
    if (dmrt_trainer_init_params(m, r->ctx, &io, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    if (r->resumed) {
        if (dmrt_load_checkpoint_file(m, r->ctx, &r->resume_file, r->err, sizeof r->err) != 0) return TR_RUNTIME;
        r->start = m->step(r->ctx);
        if (dmrt_trainer_guard_same_start(m, r->rank, r->resume_file.path, r->start, r->err, sizeof r->err) != 0)
            return TR_RUNTIME;
        snprintf(r->resumed_from, sizeof r->resumed_from, "%s", r->resume_file.path);
        uint64_t planned = 0;
        if (dmrt_trainer_meta_u64(&r->resume_file, "trainer.total_steps", &planned, r->err, sizeof r->err) < 0)
            return TR_RUNTIME;
        r->resumed_total = (int64_t)planned;
        dmrt_checkpoint_adapted(m, &r->resume_file, r->resume_adapted, sizeof r->resume_adapted);
        dmrt_st_close(&r->resume_file); /* what the run needs of it is in ctx now */
        r->resumed = 0;
    }
    if (o->trace && r->rank && dmrt_trace_enable(r->rank) != 0) return run_failed(r, "out of memory");
    return TR_OK;
}

/* How many steps: --steps and --epochs both limit; by default one epoch. The count is the
 * schedule's N (a decaying learning rate reaches min_lr at the last step); the summary. */
static int plan_steps(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    int64_t spe = r->d.steps_per_epoch;
    if (spe == 0 || o->evaluate) r->total = 0; /* sampling or evaluating only */
    else if (o->epochs >= 0) r->total = o->epochs > INT64_MAX / spe ? INT64_MAX : o->epochs * spe;
    else r->total = o->steps >= 0 ? o->steps : spe;
    if (o->steps >= 0 && o->steps < r->total) r->total = o->steps;
    if (m->set_total_steps && m->set_total_steps(r->ctx, r->total) != 0)
        return run_failed(r, "%s", dmrt_trainer_ctx_error(m, r->ctx));
    r->bar = (tr_bar){.on = r->lead && !o->quiet && isatty(STDERR_FILENO), .stdout_tty = isatty(STDOUT_FILENO)};
    if (!o->quiet) dmrt_trainer_print_summary(r->errs, m, o, &r->d, r->prog, r->total, r->threads);
    if (r->resumed_from[0] && !o->quiet)
        fprintf(r->errs, "%s: resuming from %s after step %lld%s\n", r->prog, r->resumed_from, (long long)r->start,
                r->start >= r->total ? ": no step left to train" : "");
    if (r->resume_adapted[0] && !o->quiet) fprintf(r->errs, "%s: note: %s\n", r->prog, r->resume_adapted);
    /* (the model does not say whether its schedule decays: the note holds for either) */
    if (r->resumed_total > 0 && r->resumed_total != r->total && m->set_total_steps)
        fprintf(r->errs, "%s: note: the run that wrote the checkpoint was to train %lld steps, this one %lld: a "
                         "decaying learning rate (decay = cosine or linear) or a --prune schedule now spans %lld (a "
                         "constant learning rate is unchanged)\n", r->prog, (long long)r->resumed_total,
                (long long)r->total, (long long)r->total);
    /* (a resumed run with no step left draws nothing: its data need not be replayed) */
    if (spe > 0 && r->start < r->total) dmrt_trainer_skip_steps(&r->d, r->start);
    /* (--steps may be anything up to 2^63: the bytes are checked before they are asked for) */
    if (o->trace && r->lead && r->total > 0 &&
        ((uint64_t)r->total > SIZE_MAX / sizeof *r->step_seconds ||
         !(r->step_seconds = calloc((size_t)r->total, sizeof *r->step_seconds))))
        return run_failed(r, "--trace: no memory to record the times of %lld steps", (long long)r->total);
    return TR_OK;
}

/* One step on batch b of the epoch: the batch, train_step, the guards, the step's line. */
static int train_one(tr_run *r, int64_t b) {
    const dmrt_model *m = r->m;
    double t0 = dmrt_now();
    dmrt_trainer_fill_batch(&r->d, m, r->in, r->step, b);
    float loss = 0.0f;
    double t1 = dmrt_now();
    if (r->rank) dmrt_rank_set_step(r->rank, r->step + 1);
    dmrt_blas_time blas0 = dmrt_blas_time_so_far();
    int failed = m->train_step(r->ctx, (const void *const *)r->in, &loss) != 0;
    dmrt_blas_time blas1 = dmrt_blas_time_so_far();
    if (r->rank) dmrt_rank_set_step(r->rank, -1);
    if (failed) {
        dmrt_trainer_bar_clear(&r->bar);
        return run_failed(r, "step %lld: %s", (long long)(r->step + 1), dmrt_trainer_ctx_error(m, r->ctx));
    }
    double t2 = dmrt_now();
    int non_finite;
    /* fp16: a step whose gradients overflowed was skipped by the loss scaler (its gradients
     * are left as they came out), which is no reason to stop */
    const dmrt_loss_scale *ls = m->loss_scale ? m->loss_scale(r->ctx) : NULL;
    int skipped = ls && ls->last_skipped;
    if (dmrt_trainer_guard_agree(m, r->rank, loss, &r->stop, &non_finite, r->err, sizeof r->err) != 0) return TR_RUNTIME;
    if (!non_finite && !skipped && !r->rank && !dmrt_trainer_guard_serial_gradients_finite(m, r->ctx)) non_finite = 1;
    if (non_finite) {
        dmrt_trainer_bar_clear(&r->bar);
        dmrt_trainer_guard_explain_non_finite(m, r->ctx, (const void *const *)r->in, r->step + 1, loss, !isfinite(loss),
                                              r->err, sizeof r->err);
        return TR_RUNTIME;
    }
    r->t_train += t2 - t0;
    r->t_steps += t2 - t1;
    blas_add(&r->blas, blas0, blas1);
    if (r->step_seconds) r->step_seconds[r->step] = t2 - t1;
    r->step++;
    r->last_loss = loss;
    r->acc_fresh = r->val_fresh = 0;
    if (r->bar.stdout_tty) dmrt_trainer_bar_clear(&r->bar);
    fprintf(r->outs, "step %lld loss %.9g ms %.3f", (long long)r->step, (double)loss, 1e3 * (t2 - t1));
    if (m->lr) fprintf(r->outs, " lr %.9g", m->lr(r->ctx));
    if (r->blas_on) fprintf(r->outs, " blas_ms %.3f", 1e3 * (blas1.seconds - blas0.seconds));
    /* the scale the next step's gradients are of; skipped 1: this step did not update */
    if (ls) fprintf(r->outs, " scale %.9g%s", ls->scale, skipped ? " skipped 1" : "");
    fputc('\n', r->outs);
    fflush(r->outs);
    return TR_OK;
}

/* After a step: its checkpoint (--checkpoint-every), the gradients of the run's first
 * (--dump-grads), the validation loss (--eval-every). */
static int after_step(tr_run *r) {
    const tr_opts *o = r->o;
    if (o->checkpoint && o->checkpoint_every > 0 && r->step % o->checkpoint_every == 0 && !r->stop) {
        if (r->bar.stdout_tty) dmrt_trainer_bar_clear(&r->bar);
        if (write_checkpoint(r) != 0)
            return TR_RUNTIME;
        r->checkpointed = r->step;
    }
    if (r->step == r->start + 1 && o->dump_grads && dmrt_save_grads(r->m, r->ctx, o->dump_grads, r->err, sizeof r->err)) {
        dmrt_trainer_bar_clear(&r->bar);
        return TR_RUNTIME;
    }
    if (r->d.text && o->eval_every > 0 && r->step % o->eval_every == 0) {
        int rc = dmrt_trainer_validation_loss(&r->d, r->m, r->ctx, r->in, &r->val_loss, r->err, sizeof r->err);
        if (r->bar.stdout_tty || rc != 0) dmrt_trainer_bar_clear(&r->bar);
        if (rc != 0) return TR_RUNTIME;
        r->val_fresh = 1;
        fprintf(r->outs, "step %lld val loss %.9g\n", (long long)r->step, r->val_loss);
        fflush(r->outs);
    }
    return TR_OK;
}

/* The step loop, epoch by epoch (a resumed run starts inside an epoch: batch start % spe of
 * epoch start / spe + 1), with the test accuracy after each whole epoch of Fashion-MNIST. */
static int train(tr_run *r) {
    int64_t spe = r->d.steps_per_epoch;
    r->step = r->start;
    r->checkpointed = -1;
    r->blas_on = dmrt_blas_time_on();
    for (int64_t epoch = spe ? r->start / spe + 1 : 1; r->step < r->total && !r->stop; epoch++) {
        if (r->d.mnist) dmrt_trainer_shuffle(&r->d);
        int64_t b0 = r->step - (epoch - 1) * spe, n = r->total - r->step < spe - b0 ? b0 + (r->total - r->step) : spe;
        for (int64_t b = b0; b < n && !r->stop; b++) {
            int status = train_one(r, b);
            if (status != TR_OK) return status;
            dmrt_trainer_bar_draw(&r->bar, b + 1, n, epoch, r->last_loss, r->bar.stdout_tty || b + 1 == n);
            if ((status = after_step(r)) != TR_OK) return status;
        }
        dmrt_trainer_bar_end(&r->bar);
        /* a whole epoch trained (not one a signal stopped, nor the run's last part of one) */
        if (r->d.mnist && r->step == epoch * spe && r->eval_out >= 0) {
            if (dmrt_trainer_evaluate(&r->d, r->m, r->ctx, r->in, r->eval_out, &r->acc, r->err, sizeof r->err) != 0)
                return TR_RUNTIME;
            r->acc_fresh = 1;
            fprintf(r->outs, "epoch %lld test accuracy %.4f\n", (long long)epoch, r->acc);
            fflush(r->outs);
        }
    }
    dmrt_trainer_bar_clear(&r->bar);
    return TR_OK;
}

/* The end, or a stop asked by a signal: the checkpoint of the last step (not twice, and
 * not over the one this run resumed from), then what the model owes (its drain): a pipeline
 * that does not flush (2bw) drained, a parameter servers' worker given their final
 * parameters. The checkpoint comes first because the servers stop at the drain; a 2bw
 * checkpoint drains the pipeline itself, so it holds the same either way. At the end a
 * checkpoint that cannot be written (a full disk) does not cost the run its --save: that
 * is still written, and the run fails after it with the checkpoint's error. */
static int end_training(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    if (o->checkpoint && r->checkpointed != r->step) {
        char path[4096];
        if (dmrt_checkpoint_path(o->checkpoint, r->step, path, sizeof path) != 0 || !r->resumed_from[0] ||
            !dmrt_same_file(path, r->resumed_from)) {
            if (write_checkpoint(r) != 0) {
                if (r->stop || !o->save) return TR_RUNTIME;
                snprintf(r->checkpoint_failed, sizeof r->checkpoint_failed, "%s", r->err);
            }
        }
    }
    /* the backwards and update a 2bw pipeline owes, or the parameter servers' last updates,
     * so that the weights saved and evaluated are those of every step run */
    if (m->drain) {
        if (m->drain(r->ctx) != 0)
            return run_failed(r, "%s after step %lld: %s",
                              m->param_servers ? "pulling the parameter servers' final parameters" : "draining the pipeline",
                              (long long)r->step, dmrt_trainer_ctx_error(m, r->ctx));
        r->acc_fresh = r->val_fresh = 0; /* an evaluation of the last step saw the weights before the drain */
    }
    if (r->stop) {
        /* the step is whole on every rank; what the run would write at its end is not
         * written over what the files held */
        fprintf(r->errs, "%s: stopped by a signal after step %lld of %lld%s%s\n", r->prog, (long long)r->step,
                (long long)r->total, o->save ? "; --save was not written" : "",
                o->checkpoint ? "; the checkpoint of that step was written" : "");
        return TR_STOPPED;
    }
    return TR_OK;
}

static int finish_output(tr_run *r);

/* After the step loop, the checkpoint of its end and --save: a signal no longer waits for
 * a step boundary (the evaluation and the sample after it stop at once); one that came
 * while --save was written ends the run now, as it would have during a step. */
static void leave_stepping(tr_run *r) {
    if (!r->stepping) return;
    r->stepping = 0;
    dmrt_trainer_guard_stepping(0);
    int sig = dmrt_trainer_guard_stop_signal();
    if (sig && !r->stop) raise(sig); /* the handler was reset by its delivery: the default action */
}

/* What a finished run writes and prints: --save, the trace, the final test accuracy or
 * validation loss, the "trained" line, --memory, and last the sample. --save comes first:
 * a trace that cannot be written (its picture's path made a directory meanwhile) does not
 * cost the run its trained weights; the run fails after them, saying they were written. */
static int finish(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    if (o->dump_grads && r->step == r->start)
        fprintf(r->errs, "%s: note: no step was run; --dump-grads wrote nothing\n", r->prog);
    if (o->save && dmrt_save_params(m, r->ctx, o->save, r->err, sizeof r->err) != 0) {
        if (r->checkpoint_failed[0])
            snprintf(r->err + strlen(r->err), sizeof r->err - strlen(r->err), "; and %s", r->checkpoint_failed);
        return TR_RUNTIME;
    }
    if (r->step_seconds) dmrt_trace_step_time(m, r->step_seconds + r->start, r->step - r->start, r->outs);
    if (o->trace && !r->rank)
        fprintf(r->errs, "%s: note: --trace records the ranks of a partitioned model; this one runs on one: no timeline "
                         "written\n", r->prog);
    if (o->trace && r->rank && dmrt_trace_write(m, r->rank, o->trace, r->outs, r->err, sizeof r->err) != 0) {
        size_t used = strlen(r->err);
        if (r->checkpoint_failed[0])
            used += (size_t)snprintf(r->err + used, sizeof r->err - used, "; and %s", r->checkpoint_failed);
        if (o->save && used < sizeof r->err)
            snprintf(r->err + used, sizeof r->err - used, " (--save %s was written)", o->save);
        return TR_RUNTIME;
    }
    leave_stepping(r);
    if (r->d.mnist && r->eval_out >= 0) {
        if (!r->acc_fresh && dmrt_trainer_evaluate(&r->d, m, r->ctx, r->in, r->eval_out, &r->acc, r->err, sizeof r->err))
            return TR_RUNTIME;
        fprintf(r->outs, "test accuracy %.4f\n", r->acc);
    }
    if (r->d.text) {
        if (!r->val_fresh && dmrt_trainer_validation_loss(&r->d, m, r->ctx, r->in, &r->val_loss, r->err, sizeof r->err))
            return TR_RUNTIME;
        fprintf(r->outs, "val loss %.9g\n", r->val_loss);
    }
    int64_t trained = r->step - r->start;
    if (o->evaluate) return finish_output(r); /* no step: no "trained" line */
    fprintf(r->outs, "trained %lld steps in %.3f s (%.3f ms/step)\n", (long long)trained, r->t_train,
            trained > 0 ? 1e3 * r->t_train / (double)trained : 0.0);
    const dmrt_loss_scale *ls = m->loss_scale ? m->loss_scale(r->ctx) : NULL;
    if (ls)
        fprintf(r->outs, "loss scale %.9g; %lld step%s skipped (gradients not finite) since the run began\n", ls->scale,
                (long long)ls->skipped, ls->skipped == 1 ? "" : "s");
    if (r->blas_on)
        fprintf(r->outs, "blas %.3f s of train_step's %.3f s (%.1f%%), %lld products, %.6g GFLOP\n", r->blas.seconds,
                r->t_steps, r->t_steps > 0.0 ? 100.0 * r->blas.seconds / r->t_steps : 0.0, (long long)r->blas.calls,
                1e-9 * r->blas.flops);
    return finish_output(r);
}

/* The end of finish: --memory, the sample, stdout flushed, a checkpoint's failure. */
static int finish_output(tr_run *r) {
    const dmrt_model *m = r->m;
    const tr_opts *o = r->o;
    fflush(r->outs);
    if (o->memory) dmrt_trainer_report_memory(m, r->ctx, r->rank, r->lead);
    /* Last, because its bytes are arbitrary: a parser can stop at the line "sample:". */
    if (o->sample >= 0 &&
        dmrt_trainer_sample_text(r->outs, m, r->ctx, r->in, &r->lm, o, r->err, sizeof r->err) != 0)
        return TR_RUNTIME;
    if (fflush(r->outs) != 0 || ferror(r->outs)) return run_failed(r, "writing to stdout: %s", strerror(errno));
    /* what --save holds is the run's; the checkpoint's error ends it */
    if (r->checkpoint_failed[0])
        return run_failed(r, "%s (--save %s was written)", r->checkpoint_failed, o->save);
    return TR_OK;
}

/* A failed run says so: the serial run on stderr, a rank in fail, and it stops the others
 * before its context is destroyed (reductions it started, which destroy waits for, then
 * fail promptly instead of at the deadline). */
static void report_failure(tr_run *r, char *fail, size_t faillen) {
    if (r->rank) {
        snprintf(fail, faillen, "%s", r->err);
        dmrt_rank_abort(r->rank, fail);
    } else {
        fprintf(r->errs, "%s: error: %s\n", r->prog, r->err);
    }
}

static void close_run(tr_run *r) {
    /* the checkpoints are written: another run may write into the directory now */
    dmrt_trainer_checkpoint_unlock(r->o->checkpoint, r->checkpoint_lock);
    if (r->resumed) dmrt_st_close(&r->resume_file);
    free(r->step_seconds);
    if (r->ctx) r->m->destroy(r->ctx);
    if (r->in)
        for (int i = 0; i < r->m->n_inputs; i++) dmrt_free(r->in[i]);
    free(r->in);
    dmrt_trainer_data_close(&r->d);
    if (r->devnull) fclose(r->devnull);
}

int dmrt_trainer_run(const dmrt_model *m, const tr_opts *o, const char *prog, dmrt_rank *rank, char *fail,
                     size_t faillen) {
    dmrt_init_opts io = dmrt_trainer_init_opts(o);
    if (o->save_quantized) return dmrt_trainer_save_quantized(m, o->seed, &io, o->save_quantized, (int)o->threads, prog);
    if (o->predict)
        return dmrt_trainer_predict(m, o->seed, &io, o->batch_file, o->out, (int)o->threads, prog, rank, fail, faillen);
    tr_run *r = calloc(1, sizeof *r);
    if (!r) {
        if (rank) snprintf(fail, faillen, "out of memory");
        else fprintf(stderr, "%s: error: out of memory\n", prog);
        return TR_RUNTIME;
    }
    *r = (tr_run){.m = m, .o = o, .prog = prog, .rank = rank, .lead = !rank || dmrt_rank_id(rank) == 0,
                  .checkpoint_lock = -1};
    r->outs = stdout, r->errs = stderr;
    if (!r->lead && !(r->devnull = fopen("/dev/null", "w"))) {
        int status = run_failed(r, "cannot open /dev/null: %s", strerror(errno));
        report_failure(r, fail, faillen);
        free(r);
        return status;
    }
    if (r->devnull) r->outs = r->errs = r->devnull;
    int status = choose_data(r);
    if (status == TR_OK) status = open_resume(r);
    if (status == TR_OK) status = probe_outputs(r);
    if (status == TR_OK) status = open_data(r);
    if (status == TR_OK) status = create_model(r);
    if (status == TR_OK) status = plan_steps(r);
    if (status == TR_OK) {
        dmrt_trainer_guard_stepping(1);
        r->stepping = 1;
        status = train(r);
    }
    if (status == TR_OK) status = end_training(r);
    if (status == TR_OK) status = finish(r);
    leave_stepping(r);
    if (status == TR_RUNTIME) report_failure(r, fail, faillen);
    close_run(r);
    free(r);
    return status;
}
