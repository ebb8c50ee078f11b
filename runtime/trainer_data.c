/* trainer_data.c: where the trainer's batches come from (trainer_data.h), and the files a run
 * reads and writes, checked to be distinct before it starts (internal.h: dmrt_same_file,
 * dmrt_run_files). */
#include "trainer_data.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Fashion-MNIST's four files, as --data-dir holds them (Debian's dataset-fashion-mnist). */
static const char *const mnist_files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                           "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

/* "x: f32[8, 784]" */
char *dmrt_trainer_desc_str(char *buf, size_t len, const dmrt_tensor_desc *d) {
    char s[256];
    snprintf(buf, len, "%s: %s%s", d->name, d->dtype == DMRT_F32 ? "f32" : "i32",
             dmrt_shape_str(s, sizeof s, d->rank, d->shape));
    return buf;
}

/* "x: f32[8, 784], y: i32[8]" */
char *dmrt_trainer_descs_str(char *buf, size_t len, int n, const dmrt_tensor_desc *descs) {
    size_t used = 0;
    buf[0] = '\0';
    if (n == 0) snprintf(buf, len, "none");
    for (int i = 0; i < n && used < len; i++) {
        char d[300];
        int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "",
                         dmrt_trainer_desc_str(d, sizeof d, &descs[i]));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
}

char *dmrt_trainer_inputs_str(char *buf, size_t len, const dmrt_model *m) {
    return dmrt_trainer_descs_str(buf, len, m->n_inputs, m->inputs);
}

int dmrt_trainer_open_batch_file(tr_data *d, const dmrt_model *m, const char *path, char *err,
                           size_t errlen) {
    if (m->n_inputs == 0)
        return dmrt_errorf(err, errlen, "%s: model '%s' has no inputs to feed from a batch file",
                           path, m->name);
    if (!(d->source = strdup(path))) return dmrt_errorf(err, errlen, "out of memory");
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
                               path, x->name, dmrt_trainer_desc_str(in, sizeof in, x),
                               dmrt_trainer_inputs_str(all, sizeof all, m), x->name,
                               dmrt_dtype_name(x->dtype), wantn);
        if (t->dtype != x->dtype)
            return dmrt_errorf(err, errlen, "%s: tensor '%s': dtype %s but model input %s needs %s",
                               path, t->name, dmrt_dtype_name(t->dtype),
                               dmrt_trainer_desc_str(in, sizeof in, x), dmrt_dtype_name(x->dtype));
        if (t->rank != x->rank + 1 ||
            memcmp(t->shape + 1, x->shape, sizeof(int64_t) * (size_t)x->rank) != 0)
            return dmrt_errorf(err, errlen,
                               "%s: tensor '%s': shape %s but model input %s needs %s (a leading "
                               "step dimension, then the input's shape)",
                               path, t->name, dmrt_shape_str(got, sizeof got, t->rank, t->shape),
                               dmrt_trainer_desc_str(in, sizeof in, x), wantn);
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
    /* an empty set would train nothing, or report an accuracy of 0 measured on nothing */
    if (x->n == 0) return dmrt_errorf(err, errlen, "%s/%s: holds no images", dir, xname);
    for (int64_t i = 0; i < y->n; i++)
        if (y->labels[i] < 0 || y->labels[i] >= TR_MNIST_CLASSES)
            return dmrt_errorf(err, errlen, "%s/%s: label %lld is %d, outside [0, %d)", dir, yname,
                               (long long)i, (int)y->labels[i], TR_MNIST_CLASSES);
    return 0;
}

int dmrt_trainer_open_mnist(tr_data *d, int64_t batch, const char *dir, uint64_t seed, char *err,
                      size_t errlen) {
    const char *const *names = mnist_files;
    d->mnist = 1;
    d->batch = batch;
    if (!(d->source = strdup(dir))) return dmrt_errorf(err, errlen, "out of memory");
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
void dmrt_trainer_shuffle(tr_data *d) {
    for (int64_t i = d->train_x.n - 1; i > 0; i--) {
        int64_t j = (int64_t)(dmrt_rng_u64(&d->shuffle) % (uint64_t)(i + 1));
        int64_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
}

static int find_desc(int n, const dmrt_tensor_desc *descs, const char *name) {
    for (int i = 0; i < n; i++)
        if (descs[i].name && strcmp(descs[i].name, name) == 0) return i;
    return -1;
}

int dmrt_trainer_find_lm(const dmrt_model *m, tr_lm *lm, char *why, size_t whylen) {
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

/* --data text:FILES. The corpus splits into a training part, the first 90%, and a
 * validation part, the last 10% but at least one window of T+1 bytes. */
int dmrt_trainer_open_text(tr_data *d, const tr_lm *lm, const char *list, uint64_t seed, char *err,
                     size_t errlen) {
    d->text = 1;
    d->lm = *lm;
    d->text_list = strdup(list);
    d->source = strdup(list);
    if (!d->text_list || !d->source) return dmrt_errorf(err, errlen, "out of memory");
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
int dmrt_trainer_validation_loss(tr_data *d, const dmrt_model *m, void *ctx, void **in, double *loss,
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
                               dmrt_trainer_ctx_error(m, ctx));
        sum += batch_loss;
    }
    *loss = sum / (double)batches;
    return 0;
}

/* Fills the input buffers for global step `step` (0-based), batch `b` of its epoch. */
void dmrt_trainer_fill_batch(tr_data *d, const dmrt_model *m, void **in, int64_t step, int64_t b) {
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
        size_t bytes = dmrt_trainer_desc_bytes(&m->inputs[i]);
        /* The file buffer may not be aligned for the dtype: copy. */
        memcpy(in[i], (const char *)d->bt[i]->data + (size_t)slice * bytes, bytes);
    }
}

/* A resumed run's data where the run it continues left it, after `steps` steps: the
 * shuffles of the epochs before (the current one's is the loop's), the text windows drawn. */
void dmrt_trainer_skip_steps(tr_data *d, int64_t steps) {
    if (d->mnist)
        for (int64_t e = 0; e < steps / d->steps_per_epoch; e++) dmrt_trainer_shuffle(d);
    if (d->text) {
        uint64_t offsets = (uint64_t)(d->train_bytes - d->lm.len);
        for (int64_t i = 0; i < steps * d->lm.batch; i++) (void)draw_below(&d->windows, offsets);
    }
}

/* Test accuracy with model->forward, B examples at a time; the last partial batch is
 * padded with zeros and only its real examples count. */
int dmrt_trainer_evaluate(tr_data *d, const dmrt_model *m, void *ctx, void **in, int out,
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
                               (long long)start, (long long)(start + cnt - 1), dmrt_trainer_ctx_error(m, ctx));
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

void dmrt_trainer_data_close(tr_data *d) {
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
    free(d->source);
}

/* ---- the data's identity ---------------------------------------------------------------- */

#define TR_FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define TR_FNV_PRIME UINT64_C(0x100000001b3)

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * TR_FNV_PRIME;
    return h;
}

void dmrt_trainer_data_hash(const tr_data *d, const dmrt_model *m, char hex[17]) {
    uint64_t h = TR_FNV_OFFSET;
    if (d->text) {
        h = fnv1a(h, d->corpus.bytes, (size_t)d->corpus.size);
    } else if (d->mnist) {
        /* the examples as read (pixels and labels, training then test): no second read of the files */
        const dmrt_idx *sets[4] = {&d->train_x, &d->train_y, &d->test_x, &d->test_y};
        for (int i = 0; i < 4; i++)
            h = sets[i]->images ? fnv1a(h, sets[i]->images, (size_t)(sets[i]->n * sets[i]->row_size) * sizeof(float))
                                : fnv1a(h, sets[i]->labels, (size_t)sets[i]->n * sizeof(int32_t));
    } else if (d->bt) {
        for (int i = 0; i < m->n_inputs; i++)
            h = fnv1a(h, d->bt[i]->data, (size_t)d->bt[i]->numel * dmrt_dtype_size(d->bt[i]->dtype));
    }
    snprintf(hex, 17, "%016llx", (unsigned long long)h);
}

/* ---- the files a run reads and writes ------------------------------------------------------ */

/* path without its trailing slashes ("/" stays) into buf; NULL when it does not fit. */
static const char *without_trailing_slashes(const char *path, char *buf, size_t len) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    if (n >= len) return NULL;
    memcpy(buf, path, n);
    buf[n] = '\0';
    return buf;
}

int dmrt_same_file(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return 1;
    struct stat sa, sb;
    int has_a = stat(a, &sa) == 0, has_b = stat(b, &sb) == 0;
    if (has_a && has_b) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (has_a || has_b) return 0;
    /* neither is there yet (two outputs): the same name in the same directory, which may be
     * spelled differently too ("./w.st", "sub/../w.st"); each step up shortens the paths */
    char ta[4096], tb[4096], da[4096], db[4096];
    if (!(a = without_trailing_slashes(a, ta, sizeof ta)) || !(b = without_trailing_slashes(b, tb, sizeof tb))) return 0;
    const char *na = strrchr(a, '/'), *nb = strrchr(b, '/');
    na = na ? na + 1 : a, nb = nb ? nb + 1 : b;
    if (strcmp(na, nb) != 0 || !*na || dmrt_parent_dir(a, da, sizeof da) != 0 || dmrt_parent_dir(b, db, sizeof db) != 0)
        return 0;
    return strcmp(da, a) != 0 && strcmp(db, b) != 0 && dmrt_same_file(da, db);
}

/* One more file; path copied, and compared as what is written or read: through a link, its
 * target (dmrt_atomic_target); what that refuses (a FIFO) is the probes' to report. */
static void add_file(dmrt_run_files *fs, dmrt_run_file f, const char *path) {
    if (fs->n == fs->cap) {
        int cap = fs->cap ? 2 * fs->cap : 8;
        dmrt_run_file *grown = realloc(fs->files, (size_t)cap * sizeof *grown);
        if (!grown) {
            fs->out_of_memory = 1;
            return;
        }
        fs->files = grown, fs->cap = cap;
    }
    char target[4096], why[256];
    const char *to = dmrt_atomic_target(path, target, sizeof target, why, sizeof why);
    f.path = strdup(path);
    f.target = strdup(to ? to : path);
    if (!f.path || !f.target) {
        free(f.path), free(f.target);
        fs->out_of_memory = 1;
        return;
    }
    fs->files[fs->n++] = f;
}

void dmrt_run_files_read(dmrt_run_files *fs, const char *option, const char *object, const char *holds,
                         const char *path) {
    if (path) add_file(fs, (dmrt_run_file){.option = option, .subject = option, .object = object, .holds = holds}, path);
}

void dmrt_run_files_resumed(dmrt_run_files *fs, const char *path) {
    if (path)
        add_file(fs, (dmrt_run_file){.option = "--resume", .subject = "--resume", .object = "the --resume checkpoint",
                                     .holds = "the checkpoint", .checkpoint = 1}, path);
}

void dmrt_run_files_write(dmrt_run_files *fs, const char *option, const char *subject, const char *object,
                          const char *holds, const char *path) {
    if (path)
        add_file(fs, (dmrt_run_file){.option = option, .subject = subject ? subject : option, .object = object,
                                     .holds = holds, .writes = 1}, path);
}

void dmrt_run_files_data(dmrt_run_files *fs, const char *text_list, const char *mnist_dir) {
    if (text_list) {
        /* the names between the commas, as dmrt_trainer_open_text splits them */
        for (const char *p = text_list;;) {
            size_t n = strcspn(p, ",");
            char *name = strndup(p, n);
            if (!name) fs->out_of_memory = 1;
            else dmrt_run_files_read(fs, "--data text:", "a --data text: file", "the corpus", name);
            free(name);
            if (!p[n]) break;
            p += n + 1;
        }
        return;
    }
    if (!mnist_dir) return;
    for (int i = 0; i < 4; i++) {
        char *path = join_path(mnist_dir, mnist_files[i]);
        if (!path) fs->out_of_memory = 1;
        else dmrt_run_files_read(fs, "--data-dir", "the --data-dir file", "the data set", path);
        free(path);
    }
}

int dmrt_run_files_check(const dmrt_run_files *fs, const char *checkpoint_dir, char *err, size_t errlen) {
    if (fs->out_of_memory) return dmrt_errorf(err, errlen, "out of memory");
    for (int i = 0; i < fs->n; i++) {
        const dmrt_run_file *f = &fs->files[i];
        /* the run's checkpoints replace, and --checkpoint-keep removes, what has their names
         * (but the checkpoint it resumes from, which it never writes again) */
        if (checkpoint_dir && !f->checkpoint && dmrt_checkpoint_file_step(checkpoint_dir, f->target) >= 0)
            return dmrt_errorf(err, errlen,
                               "%s %s is a checkpoint's name in --checkpoint %s (the run writes its checkpoints "
                               "there, as step-<8 digits>.safetensors, and --checkpoint-keep removes them): %s %s "
                               "(give %s another file%s)",
                               f->subject, f->path, checkpoint_dir, f->holds,
                               f->writes ? "and a checkpoint would replace each other" : "would be replaced by one",
                               f->option, f->writes ? "" : ", or the checkpoints another directory");
        if (!f->writes) continue;
        for (int j = 0; j < fs->n; j++) {
            const dmrt_run_file *g = &fs->files[j];
            if (j == i || (g->writes && j > i) || !dmrt_same_file(f->target, g->target)) continue;
            if (g->writes) /* each pair of written files once: the later one named first */
                return dmrt_errorf(err, errlen, "%s %s is %s %s: %s and %s would go to one file (give %s another file)",
                                   f->subject, f->path, g->object, g->path, f->holds, g->holds, f->option);
            return dmrt_errorf(err, errlen, "%s %s is %s %s: %s would replace %s (give %s another file)", f->subject,
                               f->path, g->object, g->path, f->holds, g->holds, f->option);
        }
    }
    return 0;
}

void dmrt_run_files_free(dmrt_run_files *fs) {
    for (int i = 0; i < fs->n; i++) {
        free(fs->files[i].path);
        free(fs->files[i].target);
    }
    free(fs->files);
    *fs = (dmrt_run_files){0};
}
