/* trainer.c: dmrt_trainer_main, the program behind `dmc run` (see docs/trainer.md).
 *
 * Parses the options, picks the data (a --batch-file; Fashion-MNIST for models shaped
 * like a classifier of it; or, with --data text:FILES, windows of a byte corpus for
 * language models), creates the context, trains, evaluates, saves, and for language
 * models optionally samples text. stdout carries only machine-readable lines (step /
 * epoch / test accuracy / val loss / trained), then the sample; everything else
 * (progress bar, notes, errors) goes to stderr.
 * Exit status: 0 success, 1 runtime error, 2 usage error. */
#include "internal.h"
#include "dmrt_comm.h"
#include "trainer_guards.h"
#include "trainer_options.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define TR_DEFAULT_DATA_DIR DMRT_TRAINER_DEFAULT_DATA_DIR
#define TR_MNIST_PIXELS 784
#define TR_MNIST_CLASSES 10
/* Stream of dmrt_rng used for shuffling (the model's create() uses its own). */
#define TR_SHUFFLE_STREAM UINT64_C(0x73687566666c65) /* "shuffle" */
/* Streams for the offsets of text training windows and for sampling: each has its own,
 * so that sampling after N steps does not depend on how many windows were drawn. */
#define TR_WINDOWS_STREAM UINT64_C(0x77696e646f7773) /* "windows" */
#define TR_SAMPLE_STREAM UINT64_C(0x73616d706c65)    /* "sample" */
/* Byte-level language models: bytes are tokens 0..255; larger ids are never sampled. */
#define TR_BYTE_TOKENS 256
/* The validation loss uses at most this many windows, so that it stays cheap enough to
 * run every few steps (--eval-every). */
#define TR_MAX_VAL_WINDOWS 32
#define TR_TEXT_PREFIX "text:"

/* TR_STOPPED: a signal asked to stop and every rank stopped at the same step boundary;
 * the process exits with 128 + the signal, as a shell reports a process it ended. */
enum { TR_OK = 0, TR_RUNTIME = 1, TR_USAGE = 2, TR_HELP = 3, TR_STOPPED = 4 };

typedef struct tr_opts {
    int64_t steps;  /* -1 when not given */
    int64_t epochs; /* -1 when not given */
    uint64_t seed;
    const char *init, *save, *batch_file, *data, *data_dir, *dump_grads;
    const char *trace;      /* --trace FILE: the pipeline's timeline (trace_files.c) */
    const char *text_files; /* --data text:FILES: the part after "text:"; else NULL */
    int64_t eval_every;     /* 0: the validation loss only at the end */
    int64_t sample;         /* bytes to generate; -1 when --sample is not given */
    const char *prompt;     /* NULL when not given (then "\n") */
    double temperature;     /* -1 when not given (then 1) */
    int64_t top_k;          /* -1 when not given (then 40) */
    int quiet;
    int memory;             /* --memory: every rank reports what its model allocated */
    int predict;            /* --predict: inference on --batch-file into --out (predict.c) */
    const char *out;
} tr_opts;

/* A byte-level language model as text training and sampling need it: inputs tokens and
 * targets, both i32[B, T], and an output logits f32[B, T, V] with V >= 256. */
typedef struct tr_lm {
    int tokens, targets; /* input indices */
    int logits;          /* output index */
    int64_t batch, len, vocab; /* B, T, V */
} tr_lm;

/* Where the batches come from: at most one of the three parts is in use (none when
 * only sampling). */
typedef struct tr_data {
    int mnist, text;
    int64_t steps_per_epoch;
    /* --batch-file */
    dmrt_st_file bf;
    const dmrt_st_tensor **bt; /* (n_inputs) tensor feeding input i */
    /* fashion-mnist */
    int64_t batch;             /* B */
    dmrt_idx train_x, train_y, test_x, test_y;
    int64_t *perm;             /* (train n) order of the current epoch */
    dmrt_rng shuffle;
    /* --data text: the corpus is bytes [0, train_bytes) for training windows, then
     * val_bytes for validation */
    tr_lm lm;
    char *text_list;           /* copy of the file list, split in place at the commas */
    const char **text_paths;   /* (n_text_paths) into text_list */
    int n_text_paths;
    dmrt_text corpus;
    int64_t train_bytes, val_bytes;
    int64_t val_windows, val_stride; /* validation windows start at val_stride * k */
    dmrt_rng windows;
} tr_data;

typedef struct tr_bar {
    int on;         /* stderr is a TTY and not --quiet */
    int stdout_tty; /* step lines land on the same screen: clear, print, redraw */
    int shown;
    double last;
} tr_bar;

/* after the table's options */
static const char usage_tail[] =
    "  -h, --help         print this text and exit\n"
    "\n"
    "stdout: one line per step, 'step <n> loss <loss> ms <ms>'; with fashion-mnist,\n"
    "'epoch <e> test accuracy <acc>' after each epoch and 'test accuracy <acc>' at the\n"
    "end; with --data text, 'step <n> val loss <loss>' every --eval-every steps and\n"
    "'val loss <loss>' at the end; then 'trained <n> steps in <s> s (<ms> ms/step)';\n"
    "last, with --sample, a line 'sample:', the prompt and the generated bytes as they\n"
    "are, and a newline.\n"
    "Exit status: 0 success, 1 runtime error, 2 usage error.\n";

static void usage(FILE *fp, const char *prog, const dmrt_model *model) {
    fprintf(fp, "usage: %s [options]\nTrains model '%s': the program behind `dmc run`.\n\n", prog,
            model->name ? model->name : "?");
    dmrt_trainer_options_print(fp);
    fputs(usage_tail, fp);
}

/* ---- options ------------------------------------------------------------------------------ */

static int parse_i64(const char *s, int64_t *v) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

static int parse_u64(const char *s, uint64_t *v) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) base = 16, s += 2;
    if (!*s) return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, base);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

/* A finite, non-negative decimal number (also as a float, which is how the sampler
 * takes it). */
static int parse_f64(const char *s, double *v) {
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x) || !isfinite((float)x)) return -1;
    *v = x;
    return 0;
}

/* Prints "PROG: message" and the usage on stderr; returns TR_USAGE. */
static int usage_error(const char *prog, const dmrt_model *model, const char *fmt, ...)
    DMRT_PRINTF(3, 4);
static int usage_error(const char *prog, const dmrt_model *model, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    usage(stderr, prog, model);
    return TR_USAGE;
}

/* "text:a.txt,b.txt": a non-empty list without empty names. */
static int valid_text_list(const char *list) {
    if (!*list) return 0;
    for (const char *p = list; *p; p++)
        if (*p == ',' && (p == list || p[1] == ',' || p[1] == '\0')) return 0;
    return 1;
}

/* Returns TR_OK, TR_HELP or TR_USAGE (message and usage printed). */
/* --predict needs --batch-file and --out, and trains nothing; --out needs --predict. */
static int check_predict(const tr_opts *o, const char *prog, const dmrt_model *model) {
    if (!o->predict)
        return o->out ? usage_error(prog, model, "--out only applies with --predict") : TR_OK;
    if (!o->batch_file || !o->out)
        return usage_error(prog, model, "--predict needs %s", !o->batch_file ? "--batch-file FILE (the inputs)" : "--out FILE (for the outputs)");
    const char *other = o->data ? "--data" : o->data_dir ? "--data-dir" : o->steps >= 0 ? "--steps" : o->epochs >= 0 ? "--epochs"
                      : o->save ? "--save" : o->dump_grads ? "--dump-grads" : o->sample >= 0 ? "--sample"
                      : o->eval_every ? "--eval-every" : o->trace ? "--trace" : NULL;
    if (other) return usage_error(prog, model, "--predict trains nothing: it cannot be combined with %s", other);
    return TR_OK;
}

static int parse_args(int argc, char **argv, tr_opts *o, const char *prog,
                      const dmrt_model *model) {
    /* the options of the table that take a value */
#define TR_VALUED(name, value, help) value ? name : NULL,
    static const char *const valued[] = {DMRT_TRAINER_OPTIONS(TR_VALUED)};
#undef TR_VALUED
    memset(o, 0, sizeof *o);
    o->steps = -1;
    o->epochs = -1;
    o->sample = -1;
    o->temperature = -1.0;
    o->top_k = -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return TR_HELP;
        if (strcmp(arg, "--quiet") == 0) {
            o->quiet = 1;
            continue;
        }
        if (strcmp(arg, "--memory") == 0) {
            o->memory = 1;
            continue;
        }
        if (strcmp(arg, "--predict") == 0) {
            o->predict = 1;
            continue;
        }
        /* --name VALUE or --name=VALUE */
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *name = NULL;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            if (valued[k] && strlen(valued[k]) == nlen && strncmp(arg, valued[k], nlen) == 0) name = valued[k];
        if (!name) {
            if (arg[0] == '-')
                return usage_error(prog, model, "unknown option '%.*s'", (int)nlen, arg);
            return usage_error(prog, model, "unexpected argument '%s'", arg);
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) return usage_error(prog, model, "option %s needs a value", name);
            val = argv[++i];
        }
        const struct {
            const char *name;
            int64_t *value;
        } integers[] = {{"--steps", &o->steps},
                        {"--epochs", &o->epochs},
                        {"--eval-every", &o->eval_every},
                        {"--sample", &o->sample},
                        {"--top-k", &o->top_k}};
        int64_t *integer = NULL;
        for (size_t k = 0; k < sizeof integers / sizeof integers[0]; k++)
            if (strcmp(name, integers[k].name) == 0) integer = integers[k].value;
        const char *want = "a non-empty value";
        int bad = 0;
        if (integer || strcmp(name, "--seed") == 0) {
            want = "a non-negative integer";
            bad = integer ? parse_i64(val, integer) : parse_u64(val, &o->seed);
        } else if (strcmp(name, "--temperature") == 0) {
            want = "a non-negative number";
            bad = parse_f64(val, &o->temperature);
        } else if (!*val) bad = -1;
        else if (strcmp(name, "--init") == 0) o->init = val;
        else if (strcmp(name, "--save") == 0) o->save = val;
        else if (strcmp(name, "--batch-file") == 0) o->batch_file = val;
        else if (strcmp(name, "--data") == 0) o->data = val;
        else if (strcmp(name, "--data-dir") == 0) o->data_dir = val;
        else if (strcmp(name, "--dump-grads") == 0) o->dump_grads = val;
        else if (strcmp(name, "--trace") == 0) o->trace = val;
        else if (strcmp(name, "--prompt") == 0) o->prompt = val;
        else if (strcmp(name, "--out") == 0) o->out = val;
        if (bad)
            return usage_error(prog, model, "bad value '%s' for %s: expected %s", val, name, want);
    }
    if (o->data && strncmp(o->data, TR_TEXT_PREFIX, strlen(TR_TEXT_PREFIX)) == 0) {
        o->text_files = o->data + strlen(TR_TEXT_PREFIX);
        if (!valid_text_list(o->text_files))
            return usage_error(prog, model,
                               "bad value '%s' for --data: expected text:FILE[,FILE...] with "
                               "non-empty file names",
                               o->data);
    } else if (o->data && strcmp(o->data, "fashion-mnist") != 0) {
        return usage_error(prog, model,
                           "unknown data set '%s' for --data (known: fashion-mnist, "
                           "text:FILE[,FILE...])",
                           o->data);
    }
    int status = check_predict(o, prog, model);
    if (status != TR_OK) return status;
    if (o->batch_file && (o->data || o->data_dir))
        return usage_error(prog, model, "--batch-file cannot be combined with %s",
                           o->data ? "--data" : "--data-dir");
    if (o->text_files && o->data_dir)
        return usage_error(prog, model,
                           "--data-dir is the directory of fashion-mnist; it cannot be combined "
                           "with --data text:... (give the files' paths there)");
    if (o->eval_every > 0 && !o->text_files)
        return usage_error(prog, model,
                           "--eval-every needs --data text:FILE[,FILE...] (its validation part)");
    /* Sampling settings without --sample would be silently ignored: most likely the
     * --sample was forgotten. */
    if (o->sample < 0 && (o->prompt || o->temperature >= 0.0 || o->top_k >= 0)) {
        const char *which = o->prompt                ? "--prompt"
                            : o->temperature >= 0.0 ? "--temperature"
                                                    : "--top-k";
        return usage_error(prog, model, "%s only applies with --sample N", which);
    }
    return TR_OK;
}

/* ---- model inspection ------------------------------------------------------------------------ */

/* "x: f32[8, 784]" */
static char *desc_str(char *buf, size_t len, const dmrt_tensor_desc *d) {
    char s[256];
    snprintf(buf, len, "%s: %s%s", d->name, d->dtype == DMRT_F32 ? "f32" : "i32",
             dmrt_shape_str(s, sizeof s, d->rank, d->shape));
    return buf;
}

/* "x: f32[8, 784], y: i32[8]" */
static char *descs_str(char *buf, size_t len, int n, const dmrt_tensor_desc *descs) {
    size_t used = 0;
    buf[0] = '\0';
    if (n == 0) snprintf(buf, len, "none");
    for (int i = 0; i < n && used < len; i++) {
        char d[300];
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         desc_str(d, sizeof d, &descs[i]));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
}

static char *inputs_str(char *buf, size_t len, const dmrt_model *m) {
    return descs_str(buf, len, m->n_inputs, m->inputs);
}

static int find_desc(int n, const dmrt_tensor_desc *descs, const char *name) {
    for (int i = 0; i < n; i++)
        if (descs[i].name && strcmp(descs[i].name, name) == 0) return i;
    return -1;
}

/* Fills *lm when the model is a byte-level language model (see tr_lm); else returns -1
 * with what does not fit in why. */
static int find_lm(const dmrt_model *m, tr_lm *lm, char *why, size_t whylen) {
    lm->tokens = find_desc(m->n_inputs, m->inputs, "tokens");
    lm->targets = find_desc(m->n_inputs, m->inputs, "targets");
    lm->logits = find_desc(m->n_outputs, m->outputs, "logits");
    /* Any other input could not be filled from a corpus. */
    if (m->n_inputs != 2 || lm->tokens < 0 || lm->targets < 0)
        return dmrt_errorf(why, whylen, "the inputs must be exactly tokens and targets");
    const dmrt_tensor_desc *tok = &m->inputs[lm->tokens], *tgt = &m->inputs[lm->targets];
    if (tok->dtype != DMRT_I32 || tok->rank != 2 || tok->shape[0] < 1 || tok->shape[1] < 1)
        return dmrt_errorf(why, whylen, "tokens is not i32[B, T]");
    if (tgt->dtype != DMRT_I32 || tgt->rank != 2 || tgt->shape[0] != tok->shape[0] ||
        tgt->shape[1] != tok->shape[1])
        return dmrt_errorf(why, whylen, "targets is not i32 of the shape of tokens");
    if (lm->logits < 0) return dmrt_errorf(why, whylen, "there is no output named logits");
    const dmrt_tensor_desc *out = &m->outputs[lm->logits];
    if (out->dtype != DMRT_F32 || out->rank != 3 || out->shape[0] != tok->shape[0] ||
        out->shape[1] != tok->shape[1])
        return dmrt_errorf(why, whylen, "logits is not f32[B, T, V] with the B and T of tokens");
    if (out->shape[2] < TR_BYTE_TOKENS)
        return dmrt_errorf(why, whylen, "logits has V = %lld, fewer than the 256 byte values",
                           (long long)out->shape[2]);
    lm->batch = tok->shape[0];
    lm->len = tok->shape[1];
    lm->vocab = out->shape[2];
    return 0;
}

/* Inputs f32[B, 784] and i32[B]: B, else 0. */
static int64_t mnist_batch(const dmrt_model *m) {
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

static size_t desc_bytes(const dmrt_tensor_desc *d) {
    return (size_t)d->numel * dmrt_dtype_size(d->dtype);
}

static const char *ctx_error(const dmrt_model *m, void *ctx) {
    const char *e = m->error ? m->error(ctx) : NULL;
    return e && *e ? e : "(no message)";
}

/* ---- data ------------------------------------------------------------------------------------- */

static int open_batch_file(tr_data *d, const dmrt_model *m, const char *path, char *err,
                           size_t errlen) {
    if (m->n_inputs == 0)
        return dmrt_errorf(err, errlen, "%s: model '%s' has no inputs to feed from a batch file",
                           path, m->name);
    if (dmrt_st_read(&d->bf, path, err, errlen) != 0) return -1;
    d->bt = calloc((size_t)m->n_inputs, sizeof *d->bt);
    if (!d->bt) return dmrt_errorf(err, errlen, "%s: out of memory", path);
    char got[256], in[300], all[1024];
    int64_t steps = -1;
    const char *first = NULL;
    for (int i = 0; i < m->n_inputs; i++) {
        const dmrt_tensor_desc *x = &m->inputs[i];
        const dmrt_st_tensor *t = dmrt_st_find(&d->bf, x->name);
        /* "[steps, 8, 4]" */
        char wantn[300] = "[steps";
        for (int k = 0; k < x->rank; k++) {
            size_t used = strlen(wantn);
            snprintf(wantn + used, sizeof wantn - used, ", %lld", (long long)x->shape[k]);
        }
        strncat(wantn, "]", sizeof wantn - strlen(wantn) - 1);
        if (!t)
            return dmrt_errorf(err, errlen,
                               "%s: no tensor '%s' for model input %s; the file needs one tensor "
                               "per input (%s), named after it, with a leading step dimension: "
                               "'%s' %s %s",
                               path, x->name, desc_str(in, sizeof in, x),
                               inputs_str(all, sizeof all, m), x->name,
                               dmrt_dtype_name(x->dtype), wantn);
        if (t->dtype != x->dtype)
            return dmrt_errorf(err, errlen, "%s: tensor '%s': dtype %s but model input %s needs %s",
                               path, t->name, dmrt_dtype_name(t->dtype),
                               desc_str(in, sizeof in, x), dmrt_dtype_name(x->dtype));
        if (t->rank != x->rank + 1 ||
            memcmp(t->shape + 1, x->shape, sizeof(int64_t) * (size_t)x->rank) != 0)
            return dmrt_errorf(err, errlen,
                               "%s: tensor '%s': shape %s but model input %s needs %s (a leading "
                               "step dimension, then the input's shape)",
                               path, t->name, dmrt_shape_str(got, sizeof got, t->rank, t->shape),
                               desc_str(in, sizeof in, x), wantn);
        if (steps < 0) {
            steps = t->shape[0];
            first = t->name;
        } else if (t->shape[0] != steps) {
            return dmrt_errorf(err, errlen, "%s: tensor '%s' has %lld steps but tensor '%s' has %lld",
                               path, t->name, (long long)t->shape[0], first, (long long)steps);
        }
        d->bt[i] = t;
    }
    if (steps == 0)
        return dmrt_errorf(err, errlen, "%s: the tensors have 0 steps (leading dimension)", path);
    d->steps_per_epoch = steps;
    return 0;
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/", name);
    return p;
}

static int read_idx_in(dmrt_idx *out, const char *dir, const char *name, char *err,
                       size_t errlen) {
    char *p = join_path(dir, name);
    if (!p) return dmrt_errorf(err, errlen, "out of memory");
    int rc = dmrt_idx_read(out, p, err, errlen);
    free(p);
    return rc;
}

/* A pair of IDX files: images of 784 pixels and labels in [0, 10), as many of each. */
static int check_pair(const dmrt_idx *x, const dmrt_idx *y, const char *dir, const char *xname,
                      const char *yname, char *err, size_t errlen) {
    if (!x->images || x->row_size != TR_MNIST_PIXELS)
        return dmrt_errorf(err, errlen, "%s/%s: expected images of 28 x 28 = 784 pixels", dir,
                           xname);
    if (!y->labels)
        return dmrt_errorf(err, errlen, "%s/%s: expected labels, found images", dir, yname);
    if (x->n != y->n)
        return dmrt_errorf(err, errlen, "%s: %s has %lld images but %s has %lld labels", dir,
                           xname, (long long)x->n, yname, (long long)y->n);
    for (int64_t i = 0; i < y->n; i++)
        if (y->labels[i] < 0 || y->labels[i] >= TR_MNIST_CLASSES)
            return dmrt_errorf(err, errlen, "%s/%s: label %lld is %d, outside [0, %d)", dir, yname,
                               (long long)i, (int)y->labels[i], TR_MNIST_CLASSES);
    return 0;
}

static int open_mnist(tr_data *d, int64_t batch, const char *dir, uint64_t seed, char *err,
                      size_t errlen) {
    static const char *const names[4] = {"train-images-idx3-ubyte.gz",
                                         "train-labels-idx1-ubyte.gz",
                                         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    d->mnist = 1;
    d->batch = batch;
    if (read_idx_in(&d->train_x, dir, names[0], err, errlen) ||
        read_idx_in(&d->train_y, dir, names[1], err, errlen) ||
        read_idx_in(&d->test_x, dir, names[2], err, errlen) ||
        read_idx_in(&d->test_y, dir, names[3], err, errlen))
        return -1;
    if (check_pair(&d->train_x, &d->train_y, dir, names[0], names[1], err, errlen) ||
        check_pair(&d->test_x, &d->test_y, dir, names[2], names[3], err, errlen))
        return -1;
    if (d->train_x.n < batch)
        return dmrt_errorf(err, errlen, "%s: %lld training examples, fewer than one batch of %lld",
                           dir, (long long)d->train_x.n, (long long)batch);
    d->steps_per_epoch = d->train_x.n / batch; /* the last partial batch is dropped */
    d->perm = malloc((size_t)d->train_x.n * sizeof *d->perm);
    if (!d->perm) return dmrt_errorf(err, errlen, "out of memory");
    for (int64_t i = 0; i < d->train_x.n; i++) d->perm[i] = i;
    dmrt_rng_init(&d->shuffle, seed, TR_SHUFFLE_STREAM);
    return 0;
}

/* Fisher-Yates over the whole training set; the rng carries on from epoch to epoch. */
static void shuffle(tr_data *d) {
    for (int64_t i = d->train_x.n - 1; i > 0; i--) {
        int64_t j = (int64_t)(dmrt_rng_u64(&d->shuffle) % (uint64_t)(i + 1));
        int64_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
}

/* --data text:FILES. The corpus splits into a training part, the first 90%, and a
 * validation part, the last 10% but at least one window of T+1 bytes. */
static int open_text(tr_data *d, const tr_lm *lm, const char *list, uint64_t seed, char *err,
                     size_t errlen) {
    d->text = 1;
    d->lm = *lm;
    d->text_list = strdup(list);
    if (!d->text_list) return dmrt_errorf(err, errlen, "out of memory");
    int n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    d->text_paths = calloc((size_t)n, sizeof *d->text_paths);
    if (!d->text_paths) return dmrt_errorf(err, errlen, "out of memory");
    for (char *p = d->text_list;;) {
        d->text_paths[d->n_text_paths++] = p;
        char *comma = strchr(p, ',');
        if (!comma) break;
        *comma = '\0';
        p = comma + 1;
    }
    if (dmrt_text_read(&d->corpus, d->n_text_paths, d->text_paths, err, errlen) != 0) return -1;

    int64_t T = lm->len, window = T + 1, size = d->corpus.size;
    d->val_bytes = size / 10 > window ? size / 10 : window;
    d->train_bytes = size - d->val_bytes;
    if (d->train_bytes < window)
        return dmrt_errorf(err, errlen,
                           "%s: a corpus of %lld bytes is too short for windows of T+1 = %lld "
                           "bytes: the training part (the first 90%%) and the validation part "
                           "(the last 10%%, at least T+1 bytes) need one window each, so at "
                           "least %lld bytes",
                           list, (long long)size, (long long)window, (long long)(2 * window));
    int64_t per_step = lm->batch * T;
    d->steps_per_epoch = d->train_bytes / per_step > 0 ? d->train_bytes / per_step : 1;

    /* Validation windows: as many non-overlapping ones as fit, at most 32, rounded down to
     * whole batches (forward's loss is a mean over the batch, so a padded batch would
     * count its padding), spread evenly over the validation part. */
    int64_t fit = (d->val_bytes - 1) / T;
    int64_t n_val = fit < TR_MAX_VAL_WINDOWS ? fit : TR_MAX_VAL_WINDOWS;
    if (n_val >= lm->batch) n_val -= n_val % lm->batch;
    d->val_windows = n_val;
    /* (n_val - 1) * T <= val_bytes - window, so the stride is at least T */
    d->val_stride = n_val > 1 ? (d->val_bytes - window) / (n_val - 1) : 0;
    dmrt_rng_init(&d->windows, seed, TR_WINDOWS_STREAM);
    return 0;
}

/* Uniform in [0, n), n > 0: draws from the top of the u64 range that would make small
 * results likelier (modulo bias) are drawn again. */
static uint64_t draw_below(dmrt_rng *rng, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* a multiple of n */
    uint64_t x;
    do x = dmrt_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

/* Row `row` of tokens and targets: the window starting at bytes[0] (T+1 bytes). */
static void fill_window(const tr_lm *lm, void **in, int64_t row, const unsigned char *bytes) {
    int32_t *tokens = (int32_t *)in[lm->tokens] + row * lm->len;
    int32_t *targets = (int32_t *)in[lm->targets] + row * lm->len;
    for (int64_t t = 0; t < lm->len; t++) {
        tokens[t] = bytes[t];
        targets[t] = bytes[t + 1];
    }
}

/* Mean of model->forward's loss over the validation windows, B per batch. When fewer
 * windows than B fit, the one batch repeats them in order (row r holds window r mod n). */
static int validation_loss(tr_data *d, const dmrt_model *m, void *ctx, void **in, double *loss,
                           char *err, size_t errlen) {
    const unsigned char *val = d->corpus.bytes + d->train_bytes;
    int64_t B = d->lm.batch, n = d->val_windows;
    int64_t batches = n >= B ? n / B : 1;
    double sum = 0.0;
    for (int64_t b = 0; b < batches; b++) {
        for (int64_t r = 0; r < B; r++) {
            int64_t k = n >= B ? b * B + r : r % n;
            fill_window(&d->lm, in, r, val + k * d->val_stride);
        }
        float batch_loss = 0.0f;
        if (m->forward(ctx, (const void *const *)in, &batch_loss) != 0)
            return dmrt_errorf(err, errlen, "validation batch %lld: %s", (long long)(b + 1),
                               ctx_error(m, ctx));
        sum += batch_loss;
    }
    *loss = sum / (double)batches;
    return 0;
}

/* Fills the input buffers for global step `step` (0-based), batch `b` of its epoch. */
static void fill_batch(tr_data *d, const dmrt_model *m, void **in, int64_t step, int64_t b) {
    if (d->text) {
        /* B windows at offsets uniform over the train_bytes - T whose T+1 bytes lie in
         * the training part */
        uint64_t offsets = (uint64_t)(d->train_bytes - d->lm.len);
        for (int64_t r = 0; r < d->lm.batch; r++)
            fill_window(&d->lm, in, r, d->corpus.bytes + draw_below(&d->windows, offsets));
        return;
    }
    if (d->mnist) {
        float *x = in[0];
        int32_t *y = in[1];
        for (int64_t r = 0; r < d->batch; r++) {
            int64_t e = d->perm[b * d->batch + r];
            memcpy(x + r * TR_MNIST_PIXELS, d->train_x.images + e * TR_MNIST_PIXELS,
                   TR_MNIST_PIXELS * sizeof(float));
            y[r] = d->train_y.labels[e];
        }
        return;
    }
    int64_t slice = step % d->steps_per_epoch;
    for (int i = 0; i < m->n_inputs; i++) {
        size_t bytes = desc_bytes(&m->inputs[i]);
        /* The file buffer may not be aligned for the dtype: copy. */
        memcpy(in[i], (const char *)d->bt[i]->data + (size_t)slice * bytes, bytes);
    }
}

/* Test accuracy with model->forward, B examples at a time; the last partial batch is
 * padded with zeros and only its real examples count. */
static int evaluate(tr_data *d, const dmrt_model *m, void *ctx, void **in, int out,
                    double *acc, char *err, size_t errlen) {
    float *x = in[0];
    int32_t *y = in[1];
    int64_t correct = 0, n = d->test_x.n, B = d->batch;
    for (int64_t start = 0; start < n; start += B) {
        int64_t cnt = n - start < B ? n - start : B;
        memcpy(x, d->test_x.images + start * TR_MNIST_PIXELS,
               (size_t)cnt * TR_MNIST_PIXELS * sizeof(float));
        memcpy(y, d->test_y.labels + start, (size_t)cnt * sizeof(int32_t));
        if (cnt < B) {
            memset(x + cnt * TR_MNIST_PIXELS, 0, (size_t)(B - cnt) * TR_MNIST_PIXELS * sizeof(float));
            memset(y + cnt, 0, (size_t)(B - cnt) * sizeof(int32_t));
        }
        float loss = 0.0f;
        if (m->forward(ctx, (const void *const *)in, &loss) != 0)
            return dmrt_errorf(err, errlen, "evaluation (test examples %lld..%lld): %s",
                               (long long)start, (long long)(start + cnt - 1), ctx_error(m, ctx));
        const float *logits = m->output(ctx, out);
        if (!logits) return dmrt_errorf(err, errlen, "evaluation: model output %d is NULL", out);
        for (int64_t r = 0; r < cnt; r++) {
            const float *row = logits + r * TR_MNIST_CLASSES;
            int best = 0;
            for (int c = 1; c < TR_MNIST_CLASSES; c++)
                if (row[c] > row[best]) best = c;
            correct += best == y[r];
        }
    }
    *acc = n ? (double)correct / (double)n : 0.0;
    return 0;
}

static void data_close(tr_data *d) {
    dmrt_st_close(&d->bf);
    free(d->bt);
    dmrt_idx_free(&d->train_x);
    dmrt_idx_free(&d->train_y);
    dmrt_idx_free(&d->test_x);
    dmrt_idx_free(&d->test_y);
    free(d->perm);
    dmrt_text_free(&d->corpus);
    free(d->text_paths);
    free(d->text_list);
}

/* ---- sampling ------------------------------------------------------------------------------- */

/* Generates o->sample bytes after the prompt; writes "sample:\n", the prompt, the bytes
 * and "\n" to stdout. Only the descriptor is used: the context (the last min(length, T)
 * bytes) sits in row 0 of tokens, every other row and the targets are zeros, and the
 * next byte is drawn from the logits of row 0 at the context's last position, over the
 * byte ids 0..255 only. One forward of the whole batch per byte: simple, not fast. */
static int sample_text(FILE *outs, const dmrt_model *m, void *ctx, void **in, const tr_lm *lm,
                       const tr_opts *o, char *err, size_t errlen) {
    const char *prompt = o->prompt ? o->prompt : "\n";
    float temperature = o->temperature >= 0.0 ? (float)o->temperature : 1.0f;
    int top_k = o->top_k < 0                 ? 40
                : o->top_k > TR_BYTE_TOKENS ? TR_BYTE_TOKENS
                                             : (int)o->top_k;
    int64_t T = lm->len;
    memset(in[lm->tokens], 0, desc_bytes(&m->inputs[lm->tokens]));
    memset(in[lm->targets], 0, desc_bytes(&m->inputs[lm->targets]));
    int32_t *context = in[lm->tokens]; /* row 0 */
    int64_t len = 0;                   /* bytes of context in row 0 */
    size_t prompt_len = strlen(prompt);
    for (size_t i = prompt_len > (size_t)T ? prompt_len - (size_t)T : 0; i < prompt_len; i++)
        context[len++] = (unsigned char)prompt[i];
    dmrt_rng rng;
    dmrt_rng_init(&rng, o->seed, TR_SAMPLE_STREAM);

    fputs("sample:\n", outs);
    fwrite(prompt, 1, prompt_len, outs);
    fflush(outs);
    for (int64_t i = 1; i <= o->sample; i++) {
        float loss = 0.0f;
        if (m->forward(ctx, (const void *const *)in, &loss) != 0)
            return dmrt_errorf(err, errlen, "sampling byte %lld: %s", (long long)i,
                               ctx_error(m, ctx));
        const float *logits = m->output(ctx, lm->logits);
        if (!logits)
            return dmrt_errorf(err, errlen, "sampling: model output %d (logits) is NULL",
                               lm->logits);
        int next = 0;
        int rc = dmrt_sample_logits(logits + (len - 1) * lm->vocab, TR_BYTE_TOKENS, temperature,
                                    top_k, &rng, &next);
        if (rc == DMRT_ERR_NOMEM) return dmrt_errorf(err, errlen, "out of memory");
        if (rc != DMRT_OK)
            return dmrt_errorf(err, errlen,
                               "sampling byte %lld: the logits of bytes 0..255 at position %lld "
                               "hold NaN or +inf, or are all -inf",
                               (long long)i, (long long)(len - 1));
        if (len == T) { /* full: slide the window by one byte */
            memmove(context, context + 1, (size_t)(T - 1) * sizeof *context);
            len--;
        }
        context[len++] = next;
        fputc(next, outs);
        fflush(outs); /* show the text as it comes */
    }
    fputc('\n', outs);
    return 0;
}

/* ---- progress bar ---------------------------------------------------------------------------- */

static void bar_clear(tr_bar *b) {
    if (b->shown) fputs("\r\033[K", stderr);
    b->shown = 0;
}

static void bar_draw(tr_bar *b, int64_t i, int64_t n, int64_t epoch, float loss, int force) {
    enum { W = 30 };
    if (!b->on) return;
    double now = dmrt_now();
    if (!force && b->shown && now - b->last < 0.1) return;
    char bar[W + 1];
    int fill = n > 0 ? (int)(i * W / n) : W;
    for (int k = 0; k < W; k++) bar[k] = k < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r[%s] %lld/%lld epoch %lld loss %.4g\033[K", bar, (long long)i,
            (long long)n, (long long)epoch, (double)loss);
    fflush(stderr);
    b->shown = 1;
    b->last = now;
}

/* End of an epoch: keep the finished bar on its own line when the step lines go
 * elsewhere, else clear it. */
static void bar_end(tr_bar *b) {
    if (!b->shown) return;
    if (b->stdout_tty) bar_clear(b);
    else fputs("\n", stderr);
    b->shown = 0;
}

/* ---- main --------------------------------------------------------------------------------- */

/* The one-line summary of model and data on stderr at the start. */
static void print_summary(FILE *errs, const dmrt_model *m, const tr_opts *o, const tr_data *d,
                          const char *prog, int64_t total) {
    int64_t np = 0;
    for (int i = 0; i < m->n_params; i++) np += m->params[i].numel;
    fprintf(errs, "%s: model '%s', %lld parameters; ", prog, m->name, (long long)np);
    if (d->mnist) {
        fprintf(errs,
                "fashion-mnist (%lld train, %lld test), batch %lld, %lld steps/epoch, %lld steps",
                (long long)d->train_x.n, (long long)d->test_x.n, (long long)d->batch,
                (long long)d->steps_per_epoch, (long long)total);
    } else if (d->text) {
        fputs("text ", errs);
        for (int i = 0; i < d->n_text_paths; i++)
            fprintf(errs, "%s%s (%lld bytes)", i ? ", " : "", d->text_paths[i],
                    (long long)d->corpus.file_sizes[i]);
        fprintf(errs,
                ": %lld bytes, %lld for training, %lld for validation (%lld windows); batch "
                "%lld x %lld, %lld steps/epoch, %lld steps",
                (long long)d->corpus.size, (long long)d->train_bytes, (long long)d->val_bytes,
                (long long)d->val_windows, (long long)d->lm.batch, (long long)d->lm.len,
                (long long)d->steps_per_epoch, (long long)total);
    } else if (o->batch_file) {
        fprintf(errs, "%s (%lld steps), %lld steps", o->batch_file,
                (long long)d->steps_per_epoch, (long long)total);
    } else {
        fputs("no data (sampling only), 0 steps", errs);
    }
    if (o->sample >= 0) fprintf(errs, "; then a sample of %lld bytes", (long long)o->sample);
    fputc('\n', errs);
}

/* --memory: one line per rank on stderr (written whole, so that threads do not mix them),
 * and the process's peak resident set from the lead rank. */
static void report_memory(const dmrt_model *m, void *ctx, dmrt_rank *rank, int lead) {
    char line[160];
    if (m->memory_peak)
        snprintf(line, sizeof line, "memory rank %d: model peak %zu bytes\n", rank ? dmrt_rank_id(rank) : 0,
                 m->memory_peak(ctx));
    else
        snprintf(line, sizeof line, "memory rank %d: model peak unknown\n", rank ? dmrt_rank_id(rank) : 0);
    fputs(line, stderr);
    struct rusage ru;
    if (lead && getrusage(RUSAGE_SELF, &ru) == 0)
        fprintf(stderr, "memory: process peak RSS %.1f MiB\n", (double)ru.ru_maxrss / 1024.0);
    fflush(stderr);
}

/* Trains on one rank (rank NULL: the serial model). Only the lead rank (world rank 0)
 * prints: the others write to errs = outs = /dev/null. A rank's failure message goes to
 * fail (the launcher reports it) instead of errs. */
static int run(const dmrt_model *m, const tr_opts *o, const char *prog, dmrt_rank *rank, char *fail,
               size_t faillen) {
    int lead = !rank || dmrt_rank_id(rank) == 0;
    FILE *devnull = lead ? NULL : fopen("/dev/null", "w");
    if (!lead && !devnull) return dmrt_errorf(fail, faillen, "cannot open /dev/null: %s", strerror(errno)), TR_RUNTIME;
    FILE *outs = lead ? stdout : devnull, *errs = lead ? stderr : devnull;
    char err[2048], ins[1024], outputs[1024], why[256];
    tr_data d;
    memset(&d, 0, sizeof d);
    void *ctx = NULL;
    void **in = NULL;
    double *step_seconds = NULL; /* --trace: every step's time, for the median beside the prediction */
    int status = TR_RUNTIME;
    const char *oom_msg = NULL;
    err[0] = '\0';

    if (o->predict) {
        if (devnull) fclose(devnull);
        return dmrt_trainer_predict(m, o->seed, o->init, o->batch_file, o->out, o->quiet, prog, rank, fail, faillen);
    }
    /* Which data: usage-level decisions first. */
    tr_lm lm = {0, 0, 0, 0, 0, 0};
    int is_lm = find_lm(m, &lm, why, sizeof why) == 0;
    if ((o->text_files || o->sample >= 0) && !is_lm) {
        fprintf(errs,
                "%s: %s needs a byte-level language model: inputs tokens: i32[B, T] and "
                "targets: i32[B, T], and an output logits: f32[B, T, V] with V >= 256; model "
                "'%s' has inputs %s and outputs %s (%s)\n",
                prog, o->text_files ? "--data text:..." : "--sample", m->name,
                inputs_str(ins, sizeof ins, m),
                descs_str(outputs, sizeof outputs, m->n_outputs, m->outputs), why);
        return TR_USAGE;
    }
    int64_t batch = mnist_batch(m);
    /* Sampling from parameters given by --init needs no corpus. */
    int sample_only = o->sample >= 0 && (o->steps == 0 || o->epochs == 0) && !o->batch_file &&
                      !o->data && !o->data_dir;
    if (!o->batch_file && !o->text_files && batch <= 0 && !sample_only) {
        inputs_str(ins, sizeof ins, m);
        if (o->data || o->data_dir)
            fprintf(errs,
                    "%s: --data fashion-mnist needs a model with inputs f32[B, 784] and i32[B]; "
                    "model '%s' has inputs %s\n",
                    prog, m->name, ins);
        else if (is_lm)
            fprintf(errs,
                    "%s: model '%s' (inputs %s) needs data: pass --data text:FILE[,FILE...] (a "
                    "corpus of bytes), or --batch-file FILE.safetensors with one tensor per "
                    "input, named after it, with a leading step dimension\n",
                    prog, m->name, ins);
        else
            fprintf(errs,
                    "%s: model '%s' (inputs %s) has no default data set; pass --batch-file "
                    "FILE.safetensors with one tensor per input, named after it, with a leading "
                    "step dimension\n",
                    prog, m->name, ins);
        return TR_USAGE;
    }
    if (!(rank ? m->create_rank != NULL : m->create != NULL) || !m->destroy || !m->param || !m->train_step) {
        fprintf(errs, "%s: model '%s' lacks create/destroy/param/train_step\n", prog, m->name);
        return TR_RUNTIME;
    }
    if ((o->text_files || o->sample >= 0) && (!m->forward || !m->output)) {
        fprintf(errs, "%s: model '%s' lacks forward/output, which %s needs\n", prog, m->name,
                o->text_files ? "the validation loss" : "sampling");
        return TR_RUNTIME;
    }

    /* what training will write, tried before it starts (only the lead rank writes) */
    if (lead && o->save && dmrt_trainer_guard_writable("--save", o->save, err, sizeof err) != 0) goto fail;
    if (lead && o->dump_grads && dmrt_trainer_guard_writable("--dump-grads", o->dump_grads, err, sizeof err) != 0) goto fail;
    if (lead && o->trace && dmrt_trainer_guard_writable("--trace", o->trace, err, sizeof err) != 0) goto fail;

    if (o->batch_file) {
        if (open_batch_file(&d, m, o->batch_file, err, sizeof err) != 0) goto fail;
    } else if (o->text_files) {
        if (open_text(&d, &lm, o->text_files, o->seed, err, sizeof err) != 0) goto fail;
    } else if (batch > 0) {
        const char *dir = o->data_dir ? o->data_dir : TR_DEFAULT_DATA_DIR;
        if (open_mnist(&d, batch, dir, o->seed, err, sizeof err) != 0) goto fail;
    } /* else sampling only: no data, no steps */
    int eval_out = -1;
    if (d.mnist) {
        if (!m->forward || !m->output) {
            fprintf(errs, "%s: note: model '%s' has no forward/output; no test accuracy\n",
                    prog, m->name);
        } else if ((eval_out = logits_output(m, batch)) < 0) {
            fprintf(errs,
                    "%s: note: model '%s' has no output f32[%lld, 10] (logits); no test accuracy\n",
                    prog, m->name, (long long)batch);
        }
    }

    in = calloc((size_t)m->n_inputs + 1, sizeof *in);
    if (!in) goto oom;
    for (int i = 0; i < m->n_inputs; i++)
        if (!(in[i] = dmrt_alloc(desc_bytes(&m->inputs[i])))) goto oom;

    ctx = rank ? m->create_rank(o->seed, rank, err, sizeof err) : m->create(o->seed, err, sizeof err);
    if (!ctx) {
        if (!err[0]) snprintf(err, sizeof err, "creating model '%s' failed", m->name);
        goto fail;
    }
    if (o->init && dmrt_load_params(m, ctx, o->init, err, sizeof err) != 0) goto fail;
    if (o->trace && rank && dmrt_trace_enable(rank) != 0) goto oom;

    /* How many steps: --steps and --epochs both limit; by default one epoch. */
    int64_t spe = d.steps_per_epoch, total;
    if (spe == 0) total = 0; /* sampling only */
    else if (o->epochs >= 0) total = o->epochs > INT64_MAX / spe ? INT64_MAX : o->epochs * spe;
    else total = o->steps >= 0 ? o->steps : spe;
    if (o->steps >= 0 && o->steps < total) total = o->steps;
    /* the schedule's N: a decaying learning rate reaches min_lr at the last step */
    if (m->set_total_steps && m->set_total_steps(ctx, total) != 0) {
        snprintf(err, sizeof err, "%s", ctx_error(m, ctx));
        goto fail;
    }

    tr_bar bar = {0, 0, 0, 0.0};
    bar.on = lead && !o->quiet && isatty(STDERR_FILENO);
    bar.stdout_tty = isatty(STDOUT_FILENO);
    if (!o->quiet) print_summary(errs, m, o, &d, prog, total);

    double t_train = 0.0, acc = 0.0, val_loss = 0.0;
    if (o->trace && lead && total > 0 && !(step_seconds = malloc((size_t)total * sizeof *step_seconds))) goto oom;
    int acc_fresh = 0, val_fresh = 0; /* acc, val_loss are for the current parameters */
    int64_t step = 0;
    int stop = 0;
    for (int64_t epoch = 1; step < total && !stop; epoch++) {
        if (d.mnist) shuffle(&d);
        int64_t n = total - step < spe ? total - step : spe;
        for (int64_t b = 0; b < n && !stop; b++) {
            double t0 = dmrt_now();
            fill_batch(&d, m, in, step, b);
            float loss = 0.0f;
            double t1 = dmrt_now();
            if (rank) dmrt_rank_set_step(rank, step + 1);
            int failed = m->train_step(ctx, (const void *const *)in, &loss) != 0;
            if (rank) dmrt_rank_set_step(rank, -1);
            if (failed) {
                bar_clear(&bar);
                snprintf(err, sizeof err, "step %lld: %s", (long long)(step + 1), ctx_error(m, ctx));
                goto fail;
            }
            double t2 = dmrt_now();
            int non_finite;
            if (dmrt_trainer_guard_agree(rank, loss, &stop, &non_finite, err, sizeof err) != 0) goto fail;
            if (!non_finite && !rank && !dmrt_trainer_guard_serial_gradients_finite(m, ctx)) non_finite = 1;
            if (non_finite) {
                bar_clear(&bar);
                dmrt_trainer_guard_explain_non_finite(m, ctx, (const void *const *)in, step + 1, loss, !isfinite(loss), err,
                                            sizeof err);
                goto fail;
            }
            t_train += t2 - t0;
            if (step_seconds) step_seconds[step] = t2 - t1;
            step++;
            acc_fresh = val_fresh = 0;
            if (bar.stdout_tty) bar_clear(&bar);
            fprintf(outs, "step %lld loss %.9g ms %.3f", (long long)step, (double)loss, 1e3 * (t2 - t1));
            if (m->lr) fprintf(outs, " lr %.9g", m->lr(ctx));
            fputc('\n', outs);
            fflush(outs);
            bar_draw(&bar, b + 1, n, epoch, loss, bar.stdout_tty || b + 1 == n);
            if (step == 1 && o->dump_grads) {
                if (dmrt_save_grads(m, ctx, o->dump_grads, err, sizeof err) != 0) {
                    bar_clear(&bar);
                    goto fail;
                }
            }
            if (d.text && o->eval_every > 0 && step % o->eval_every == 0) {
                int rc = validation_loss(&d, m, ctx, in, &val_loss, err, sizeof err);
                if (bar.stdout_tty || rc != 0) bar_clear(&bar);
                if (rc != 0) goto fail;
                val_fresh = 1;
                fprintf(outs, "step %lld val loss %.9g\n", (long long)step, val_loss);
                fflush(outs);
            }
        }
        bar_end(&bar);
        if (d.mnist && n == spe && eval_out >= 0) {
            if (evaluate(&d, m, ctx, in, eval_out, &acc, err, sizeof err) != 0) goto fail;
            acc_fresh = 1;
            fprintf(outs, "epoch %lld test accuracy %.4f\n", (long long)epoch, acc);
            fflush(outs);
        }
    }
    bar_clear(&bar);
    if (stop) {
        /* the step is whole on every rank; what the run would write at its end is not
         * written over what the files held */
        fprintf(errs, "%s: stopped by a signal after step %lld of %lld%s\n", prog, (long long)step, (long long)total,
                o->save ? "; --save was not written" : "");
        status = TR_STOPPED;
        goto done;
    }
    if (o->dump_grads && step == 0)
        fprintf(errs, "%s: note: no step was run; --dump-grads wrote nothing\n", prog);
    if (step_seconds) dmrt_trace_step_time(m, step_seconds, step, outs);
    if (o->trace && !rank)
        fprintf(errs, "%s: note: --trace records the ranks of a partitioned model; this one runs on one: no timeline written\n",
                prog);
    if (o->trace && rank && dmrt_trace_write(m, rank, o->trace, outs, err, sizeof err) != 0) goto fail;

    if (o->save && dmrt_save_params(m, ctx, o->save, err, sizeof err) != 0) goto fail;
    if (d.mnist && eval_out >= 0) {
        if (!acc_fresh && evaluate(&d, m, ctx, in, eval_out, &acc, err, sizeof err) != 0)
            goto fail;
        fprintf(outs, "test accuracy %.4f\n", acc);
    }
    if (d.text) {
        if (!val_fresh && validation_loss(&d, m, ctx, in, &val_loss, err, sizeof err) != 0)
            goto fail;
        fprintf(outs, "val loss %.9g\n", val_loss);
    }
    fprintf(outs, "trained %lld steps in %.3f s (%.3f ms/step)\n", (long long)step, t_train,
           step ? 1e3 * t_train / (double)step : 0.0);
    fflush(outs);
    if (o->memory) report_memory(m, ctx, rank, lead);
    /* Last, because its bytes are arbitrary: a parser can stop at the line "sample:". */
    if (o->sample >= 0 && sample_text(outs, m, ctx, in, &lm, o, err, sizeof err) != 0) goto fail;
    if (fflush(outs) != 0 || ferror(outs)) {
        snprintf(err, sizeof err, "writing to stdout: %s", strerror(errno));
        goto fail;
    }
    status = TR_OK;
    goto done;

oom:
    oom_msg = "out of memory";
fail:
    if (rank) {
        snprintf(fail, faillen, "%s", oom_msg ? oom_msg : err);
        /* before destroy: the other ranks stop, so that reductions this rank started
         * (which destroy waits for) fail promptly instead of at the deadline */
        dmrt_rank_abort(rank, fail);
    } else {
        fprintf(errs, "%s: error: %s\n", prog, oom_msg ? oom_msg : err);
    }
    status = TR_RUNTIME;
done:
    free(step_seconds);
    if (ctx) m->destroy(ctx);
    if (in)
        for (int i = 0; i < m->n_inputs; i++) dmrt_free(in[i]);
    free(in);
    data_close(&d);
    if (devnull) fclose(devnull);
    return status;
}

/* ---- SPMD: one run() per rank ------------------------------------------------------------- */

typedef struct tr_spmd {
    const dmrt_model *m;
    const tr_opts *o;
    const char *prog;
    /* written by every rank thread: atomic */
    _Atomic int usage_failed; /* a rank found a usage error (its lead printed it) */
    _Atomic int lead;         /* this process hosts world rank 0 (MPI: one rank per process) */
    _Atomic int ran;          /* some rank of this process started */
    _Atomic int stopped;      /* the ranks stopped together, asked by a signal */
} tr_spmd;

static int rank_main(dmrt_rank *r, void *arg) {
    tr_spmd *s = arg;
    char fail[2048] = "";
    s->ran = 1;
    if (dmrt_rank_id(r) == 0) s->lead = 1;
    int status = run(s->m, s->o, s->prog, r, fail, sizeof fail);
    if (status == TR_STOPPED) {
        s->stopped = 1;
        return 0; /* not a failure: every rank stopped at the same step */
    }
    if (status == TR_USAGE) {
        s->usage_failed = 1;
        dmrt_rank_abort(r, "usage error");
    } else if (status != TR_OK) {
        dmrt_rank_abort(r, fail[0] ? fail : "failed");
    }
    return status;
}

static int threads_launch(void *launch_arg, int n_ranks, dmrt_rank_main main_fn, void *arg, char *err,
                          size_t errlen) {
    (void)launch_arg;
    dmrt_blas_share_cores(n_ranks);
    return dmrt_threads_run(n_ranks, main_fn, arg, err, errlen);
}

/* The process's exit status for run()'s: a stop asked by a signal as a shell shows the
 * signal's (128 + its number; SIGTERM when another process of the mesh received it). */
static int exit_status(int status) {
    if (status != TR_STOPPED) return status;
    int sig = dmrt_trainer_guard_stop_signal();
    return 128 + (sig ? sig : SIGTERM);
}

int dmrt_trainer_main_spmd(const dmrt_model *model, int argc, char **argv, dmrt_launcher launch,
                           void *launch_arg) {
    const char *prog = argc > 0 && argv[0] && argv[0][0] ? argv[0] : "dmrt-trainer";
    tr_opts o;
    int r = parse_args(argc, argv, &o, prog, model);
    if (r == TR_HELP) {
        usage(stdout, prog, model);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (r != TR_OK) return r;
    dmrt_trainer_guard_install_signals();
    if (model->n_ranks <= 1 || !model->create_rank) return exit_status(run(model, &o, prog, NULL, NULL, 0));
    if (model->n_ranks > INT32_MAX) {
        fprintf(stderr, "%s: error: model '%s' needs %lld ranks\n", prog, model->name, (long long)model->n_ranks);
        return TR_RUNTIME;
    }
    tr_spmd s = {model, &o, prog, 0, 0, 0, 0};
    char err[4096] = "";
    if (launch != threads_launch) {
        /* one rank per process: as many processes on this machine as the launcher says */
        const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        if (!local) local = getenv("MPI_LOCALNRANKS");
        if (local && atoi(local) > 0) dmrt_blas_share_cores(atoi(local));
    }
    int status = launch(launch_arg, (int)model->n_ranks, rank_main, &s, err, sizeof err);
    if (status == 0) return exit_status(s.stopped ? TR_STOPPED : TR_OK);
    if (s.usage_failed) return TR_USAGE;
    /* every rank learns the first failure; the one hosting rank 0 says it (the MPI
     * launcher may fail before any rank ran: then every process does) */
    if (s.lead || !s.ran) fprintf(stderr, "%s: error: %s\n", prog, err[0] ? err : "a rank failed");
    return TR_RUNTIME;
}

int dmrt_trainer_main(const dmrt_model *model, int argc, char **argv) {
    return dmrt_trainer_main_spmd(model, argc, argv, threads_launch, NULL);
}
