/* trainer.c: dmrt_trainer_main, the program behind `dmc run` (see docs/trainer.md).
 *
 * Parses the options, picks the data (a --batch-file, or Fashion-MNIST for models
 * shaped like a classifier of it), creates the context, trains, evaluates, saves.
 * stdout carries only machine-readable lines (step / epoch / test accuracy / trained);
 * everything else (progress bar, notes, errors) goes to stderr.
 * Exit status: 0 success, 1 runtime error, 2 usage error. */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TR_DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"
#define TR_MNIST_PIXELS 784
#define TR_MNIST_CLASSES 10
/* Stream of dmrt_rng used for shuffling (the model's create() uses its own). */
#define TR_SHUFFLE_STREAM UINT64_C(0x73687566666c65) /* "shuffle" */

enum { TR_OK = 0, TR_RUNTIME = 1, TR_USAGE = 2, TR_HELP = 3 };

typedef struct tr_opts {
    int64_t steps;  /* -1 when not given */
    int64_t epochs; /* -1 when not given */
    uint64_t seed;
    const char *init, *save, *batch_file, *data, *data_dir, *dump_grads;
    int quiet;
} tr_opts;

/* Where the batches come from: exactly one of the two parts is in use. */
typedef struct tr_data {
    int mnist;
    int64_t steps_per_epoch;
    /* --batch-file */
    dmrt_st_file bf;
    const dmrt_st_tensor **bt; /* (n_inputs) tensor feeding input i */
    /* fashion-mnist */
    int64_t batch;             /* B */
    dmrt_idx train_x, train_y, test_x, test_y;
    int64_t *perm;             /* (train n) order of the current epoch */
    dmrt_rng shuffle;
} tr_data;

typedef struct tr_bar {
    int on;         /* stderr is a TTY and not --quiet */
    int stdout_tty; /* step lines land on the same screen: clear, print, redraw */
    int shown;
    double last;
} tr_bar;

static const char usage_text[] =
    "usage: %s [options]\n"
    "Trains model '%s': the program behind `dmc run`.\n"
    "\n"
    "  --steps N          train N steps, cycling through the data as needed\n"
    "  --epochs N         train N passes over the data (default 1); with --steps, stop\n"
    "                     at whichever limit comes first\n"
    "  --seed S           seed of parameter initialisation and shuffling (default 0)\n"
    "  --init FILE        load the parameters from a safetensors file after initialisation\n"
    "  --save FILE        write the parameters to a safetensors file at the end (atomically)\n"
    "  --batch-file FILE  safetensors file with one tensor per model input, named after it,\n"
    "                     with a leading step dimension: step i trains on slice i\n"
    "  --data NAME        built-in data set: fashion-mnist (the default for models whose\n"
    "                     inputs are f32[B, 784] and i32[B])\n"
    "  --data-dir DIR     directory of the data set files\n"
    "                     (default " TR_DEFAULT_DATA_DIR ")\n"
    "  --dump-grads FILE  after the first step, write every parameter's gradient\n"
    "  --quiet            no progress bar\n"
    "  -h, --help         print this text and exit\n"
    "\n"
    "stdout: one line per step, 'step <n> loss <loss> ms <ms>'; with a data set,\n"
    "'epoch <e> test accuracy <acc>' after each epoch and 'test accuracy <acc>' at the\n"
    "end; last, 'trained <n> steps in <s> s (<ms> ms/step)'.\n"
    "Exit status: 0 success, 1 runtime error, 2 usage error.\n";

static void usage(FILE *fp, const char *prog, const dmrt_model *model) {
    fprintf(fp, usage_text, prog, model->name ? model->name : "?");
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

/* Returns TR_OK, TR_HELP or TR_USAGE (message and usage printed). */
static int parse_args(int argc, char **argv, tr_opts *o, const char *prog,
                      const dmrt_model *model) {
    static const char *const valued[] = {"--steps", "--epochs",     "--seed",     "--init",
                                         "--save",  "--batch-file", "--data",     "--data-dir",
                                         "--dump-grads"};
    memset(o, 0, sizeof *o);
    o->steps = -1;
    o->epochs = -1;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return TR_HELP;
        if (strcmp(arg, "--quiet") == 0) {
            o->quiet = 1;
            continue;
        }
        /* --name VALUE or --name=VALUE */
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *name = NULL;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            if (strlen(valued[k]) == nlen && strncmp(arg, valued[k], nlen) == 0) name = valued[k];
        if (!name) {
            if (arg[0] == '-')
                fprintf(stderr, "%s: unknown option '%.*s'\n", prog, (int)nlen, arg);
            else
                fprintf(stderr, "%s: unexpected argument '%s'\n", prog, arg);
            usage(stderr, prog, model);
            return TR_USAGE;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (!val) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: option %s needs a value\n", prog, name);
                usage(stderr, prog, model);
                return TR_USAGE;
            }
            val = argv[++i];
        }
        int bad = 0;
        if (strcmp(name, "--steps") == 0) bad = parse_i64(val, &o->steps);
        else if (strcmp(name, "--epochs") == 0) bad = parse_i64(val, &o->epochs);
        else if (strcmp(name, "--seed") == 0) bad = parse_u64(val, &o->seed);
        else if (!*val) bad = -1;
        else if (strcmp(name, "--init") == 0) o->init = val;
        else if (strcmp(name, "--save") == 0) o->save = val;
        else if (strcmp(name, "--batch-file") == 0) o->batch_file = val;
        else if (strcmp(name, "--data") == 0) o->data = val;
        else if (strcmp(name, "--data-dir") == 0) o->data_dir = val;
        else if (strcmp(name, "--dump-grads") == 0) o->dump_grads = val;
        if (bad) {
            int numeric = strcmp(name, "--steps") == 0 || strcmp(name, "--epochs") == 0 ||
                          strcmp(name, "--seed") == 0;
            const char *want = numeric ? "a non-negative integer" : "a non-empty value";
            fprintf(stderr, "%s: bad value '%s' for %s: expected %s\n", prog, val, name, want);
            usage(stderr, prog, model);
            return TR_USAGE;
        }
    }
    if (o->data && strcmp(o->data, "fashion-mnist") != 0) {
        fprintf(stderr, "%s: unknown data set '%s' for --data (known: fashion-mnist)\n", prog,
                o->data);
        usage(stderr, prog, model);
        return TR_USAGE;
    }
    if (o->batch_file && (o->data || o->data_dir)) {
        fprintf(stderr, "%s: --batch-file cannot be combined with %s\n", prog,
                o->data ? "--data" : "--data-dir");
        usage(stderr, prog, model);
        return TR_USAGE;
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
static char *inputs_str(char *buf, size_t len, const dmrt_model *m) {
    size_t used = 0;
    buf[0] = '\0';
    if (m->n_inputs == 0) snprintf(buf, len, "none");
    for (int i = 0; i < m->n_inputs && used < len; i++) {
        char d[300];
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         desc_str(d, sizeof d, &m->inputs[i]));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
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

/* Fills the input buffers for global step `step` (0-based), batch `b` of its epoch. */
static void fill_batch(tr_data *d, const dmrt_model *m, void **in, int64_t step, int64_t b) {
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

static int run(const dmrt_model *m, const tr_opts *o, const char *prog) {
    char err[2048], ins[1024];
    tr_data d;
    memset(&d, 0, sizeof d);
    void *ctx = NULL;
    void **in = NULL;
    int status = TR_RUNTIME;
    const char *oom_msg = NULL;
    err[0] = '\0';

    /* Which data: usage-level decisions first. */
    int64_t batch = mnist_batch(m);
    if (!o->batch_file && batch <= 0) {
        inputs_str(ins, sizeof ins, m);
        if (o->data || o->data_dir)
            fprintf(stderr,
                    "%s: --data fashion-mnist needs a model with inputs f32[B, 784] and i32[B]; "
                    "model '%s' has inputs %s\n",
                    prog, m->name, ins);
        else
            fprintf(stderr,
                    "%s: model '%s' (inputs %s) has no default data set; pass --batch-file "
                    "FILE.safetensors with one tensor per input, named after it, with a leading "
                    "step dimension\n",
                    prog, m->name, ins);
        return TR_USAGE;
    }
    if (!m->create || !m->destroy || !m->param || !m->train_step) {
        fprintf(stderr, "%s: model '%s' lacks create/destroy/param/train_step\n", prog, m->name);
        return TR_RUNTIME;
    }

    if (o->batch_file) {
        if (open_batch_file(&d, m, o->batch_file, err, sizeof err) != 0) goto fail;
    } else {
        const char *dir = o->data_dir ? o->data_dir : TR_DEFAULT_DATA_DIR;
        if (open_mnist(&d, batch, dir, o->seed, err, sizeof err) != 0) goto fail;
    }
    int eval_out = -1;
    if (d.mnist) {
        if (!m->forward || !m->output) {
            fprintf(stderr, "%s: note: model '%s' has no forward/output; no test accuracy\n",
                    prog, m->name);
        } else if ((eval_out = logits_output(m, batch)) < 0) {
            fprintf(stderr,
                    "%s: note: model '%s' has no output f32[%lld, 10] (logits); no test accuracy\n",
                    prog, m->name, (long long)batch);
        }
    }

    in = calloc((size_t)m->n_inputs + 1, sizeof *in);
    if (!in) goto oom;
    for (int i = 0; i < m->n_inputs; i++)
        if (!(in[i] = dmrt_alloc(desc_bytes(&m->inputs[i])))) goto oom;

    ctx = m->create(o->seed, err, sizeof err);
    if (!ctx) {
        if (!err[0]) snprintf(err, sizeof err, "creating model '%s' failed", m->name);
        goto fail;
    }
    if (o->init && dmrt_load_params(m, ctx, o->init, err, sizeof err) != 0) goto fail;

    /* How many steps: --steps and --epochs both limit; by default one epoch. */
    int64_t spe = d.steps_per_epoch, total;
    if (o->epochs >= 0) total = o->epochs > INT64_MAX / spe ? INT64_MAX : o->epochs * spe;
    else total = o->steps >= 0 ? o->steps : spe;
    if (o->steps >= 0 && o->steps < total) total = o->steps;

    tr_bar bar = {0, 0, 0, 0.0};
    bar.on = !o->quiet && isatty(STDERR_FILENO);
    bar.stdout_tty = isatty(STDOUT_FILENO);
    if (!o->quiet) {
        int64_t np = 0;
        for (int i = 0; i < m->n_params; i++) np += m->params[i].numel;
        if (d.mnist)
            fprintf(stderr,
                    "%s: model '%s', %lld parameters; fashion-mnist (%lld train, %lld test), "
                    "batch %lld, %lld steps/epoch, %lld steps\n",
                    prog, m->name, (long long)np, (long long)d.train_x.n, (long long)d.test_x.n,
                    (long long)batch, (long long)spe, (long long)total);
        else
            fprintf(stderr, "%s: model '%s', %lld parameters; %s (%lld steps), %lld steps\n", prog,
                    m->name, (long long)np, o->batch_file, (long long)spe, (long long)total);
    }

    double t_train = 0.0, acc = 0.0;
    int acc_fresh = 0; /* acc is for the current parameters */
    int64_t step = 0;
    for (int64_t epoch = 1; step < total; epoch++) {
        if (d.mnist) shuffle(&d);
        int64_t n = total - step < spe ? total - step : spe;
        for (int64_t b = 0; b < n; b++) {
            double t0 = dmrt_now();
            fill_batch(&d, m, in, step, b);
            float loss = 0.0f;
            double t1 = dmrt_now();
            if (m->train_step(ctx, (const void *const *)in, &loss) != 0) {
                bar_clear(&bar);
                snprintf(err, sizeof err, "step %lld: %s", (long long)(step + 1), ctx_error(m, ctx));
                goto fail;
            }
            double t2 = dmrt_now();
            t_train += t2 - t0;
            step++;
            acc_fresh = 0;
            if (bar.stdout_tty) bar_clear(&bar);
            printf("step %lld loss %.9g ms %.3f\n", (long long)step, (double)loss,
                   1e3 * (t2 - t1));
            fflush(stdout);
            bar_draw(&bar, b + 1, n, epoch, loss, bar.stdout_tty || b + 1 == n);
            if (step == 1 && o->dump_grads) {
                const void **g = calloc((size_t)m->n_params + 1, sizeof *g);
                if (!g) goto oom;
                for (int i = 0; i < m->n_params && m->grad; i++) g[i] = m->grad(ctx, i);
                int rc = m->grad ? dmrt_st_write(o->dump_grads, m->n_params, m->params, g, err,
                                                 sizeof err)
                                 : dmrt_errorf(err, sizeof err,
                                               "--dump-grads: model '%s' exposes no gradients",
                                               m->name);
                free(g);
                if (rc != 0) {
                    bar_clear(&bar);
                    goto fail;
                }
            }
        }
        bar_end(&bar);
        if (d.mnist && n == spe && eval_out >= 0) {
            if (evaluate(&d, m, ctx, in, eval_out, &acc, err, sizeof err) != 0) goto fail;
            acc_fresh = 1;
            printf("epoch %lld test accuracy %.4f\n", (long long)epoch, acc);
            fflush(stdout);
        }
    }
    bar_clear(&bar);
    if (o->dump_grads && step == 0)
        fprintf(stderr, "%s: note: no step was run; --dump-grads wrote nothing\n", prog);

    if (o->save && dmrt_save_params(m, ctx, o->save, err, sizeof err) != 0) goto fail;
    if (d.mnist && eval_out >= 0) {
        if (!acc_fresh && evaluate(&d, m, ctx, in, eval_out, &acc, err, sizeof err) != 0)
            goto fail;
        printf("test accuracy %.4f\n", acc);
    }
    printf("trained %lld steps in %.3f s (%.3f ms/step)\n", (long long)step, t_train,
           step ? 1e3 * t_train / (double)step : 0.0);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        snprintf(err, sizeof err, "writing to stdout: %s", strerror(errno));
        goto fail;
    }
    status = TR_OK;
    goto done;

oom:
    oom_msg = "out of memory";
fail:
    fprintf(stderr, "%s: error: %s\n", prog, oom_msg ? oom_msg : err);
    status = TR_RUNTIME;
done:
    if (ctx) m->destroy(ctx);
    if (in)
        for (int i = 0; i < m->n_inputs; i++) dmrt_free(in[i]);
    free(in);
    data_close(&d);
    return status;
}

int dmrt_trainer_main(const dmrt_model *model, int argc, char **argv) {
    const char *prog = argc > 0 && argv[0] && argv[0][0] ? argv[0] : "dmrt-trainer";
    tr_opts o;
    int r = parse_args(argc, argv, &o, prog, model);
    if (r == TR_HELP) {
        usage(stdout, prog, model);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (r != TR_OK) return r;
    return run(model, &o, prog);
}
