/* checkpoint.c: a model's training state in one safetensors file, and the trainer's
 * directories of them.
 *
 * A checkpoint holds every parameter under its .dm name, every optimizer state tensor under
 * its own ("fc1.weight.exp_avg"), whole, and in "__metadata__" the format, the model's name,
 * the updates done ("dmc.step"), every tensor's CRC-32C ("dmc.crc32c.<name>") and what the
 * caller adds (the trainer: its run, seed, data). Whole tensors make it independent of the mesh
 * that wrote it. Writing is atomic (dmrt_st_write); loading checks every tensor, its checksum
 * included, before it changes anything. The checksums' metadata is shared with the other
 * files of weights (dmrt_file_meta_with_crc32c: --save, --save-quantized). */
#include "crc32c.h"
#include "internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 2: every tensor has its "dmc.crc32c.<name>"; 1 (read, not written): no checksums */
#define CKPT_FORMAT "dmc checkpoint 2"
#define CKPT_FORMAT_1 "dmc checkpoint 1"
#define CKPT_CRC_PREFIX "dmc.crc32c."
#define CKPT_PREFIX "step-"
#define CKPT_SUFFIX ".safetensors"
/* metadata the checkpoint itself needs (format, model, step, fp16's loss scaler with its
 * interval, the parameter servers' updates); callers add theirs after these */
enum { CKPT_OWN_META = 8 };

/* Tensor i of the checkpoint: parameters first, then the optimizer's state. */
static const dmrt_tensor_desc *ckpt_desc(const dmrt_model *m, int i) {
    return i < m->n_params ? &m->params[i] : &m->states[i - m->n_params];
}

/* Tensor i whole into whole (every rank of an SPMD model calls it). */
static int gather_whole(const dmrt_model *m, void *ctx, int i, float *whole) {
    if (i >= m->n_params) return m->state_gather(ctx, i - m->n_params, whole);
    if (m->gather) return m->gather(ctx, i, 0, whole);
    memcpy(whole, m->param(ctx, i), (size_t)m->params[i].numel * sizeof(float));
    return DMRT_OK;
}

int dmrt_checkpoint_drain(const dmrt_model *m, void *ctx, const char *path, char *err, size_t errlen) {
    if (m->param_servers && m->ps_snapshot && m->ps_snapshot(ctx) != DMRT_OK)
        return dmrt_errorf(err, errlen, "%s: reading the parameter servers' state: %s", path, m->error(ctx));
    if (!m->checkpoint_drains || !m->drain || m->drain(ctx) == DMRT_OK) return 0;
    return dmrt_errorf(err, errlen, "%s: draining the pipeline before the checkpoint: %s", path, m->error(ctx));
}

int dmrt_save_checkpoint(const dmrt_model *m, void *ctx, const char *path, int n_meta, const char *const *keys,
                         const char *const *values, char *err, size_t errlen) {
    if (!m->checkpoints || !m->step)
        return dmrt_errorf(err, errlen, "%s: model '%s' cannot write checkpoints: %s", path, m->name,
                           m->checkpoints_unsupported ? m->checkpoints_unsupported : "it does not say how");
    if (dmrt_checkpoint_drain(m, ctx, path, err, errlen) != 0) return -1;
    int n = m->n_params + m->n_states;
    int writer = !m->rank_id || m->rank_id(ctx) == 0;
    /* the writing rank keeps every tensor until the file is written; the others gather into
     * one buffer, reused */
    float **whole = calloc(n ? (size_t)n : 1, sizeof *whole);
    const void **data = calloc(n ? (size_t)n : 1, sizeof *data);
    dmrt_tensor_desc *descs = calloc(n ? (size_t)n : 1, sizeof *descs);
    /* the metadata: the checkpoint's own (the loss scaler's four keys only where there is
     * one), the caller's, then a checksum per tensor */
    const dmrt_loss_scale *ls = m->loss_scale ? m->loss_scale(ctx) : NULL;
    int servers = m->param_servers && m->ps_updates;
    int n_own = 0;
    const char **own_keys = calloc((size_t)(CKPT_OWN_META + n_meta), sizeof *own_keys);
    const char **own_values = calloc((size_t)(CKPT_OWN_META + n_meta), sizeof *own_values);
    dmrt_file_meta meta = {0};
    int rc = 0;
    if (!whole || !data || !descs || !own_keys || !own_values) rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
    int64_t most = 0;
    for (int i = 0; i < n && rc == 0; i++) most = ckpt_desc(m, i)->numel > most ? ckpt_desc(m, i)->numel : most;
    for (int i = 0; i < n && rc == 0; i++) {
        const dmrt_tensor_desc *d = ckpt_desc(m, i);
        descs[i] = *d;
        if (writer || i == 0) whole[i] = dmrt_alloc((size_t)(writer ? d->numel : most) * sizeof(float));
        float *into = writer ? whole[i] : whole[0];
        /* a failed gather leaves the other ranks' collectives waiting: they fail on this
         * rank's abort or their deadline, and no file is written */
        if (!into) rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
        else if (gather_whole(m, ctx, i, into) != 0)
            rc = dmrt_errorf(err, errlen, "%s: gathering '%s': %s", path, d->name, m->error(ctx));
        else /* every rank gathers each tensor whole, and fails alike */
            rc = dmrt_check_finite_to_write(path, i < m->n_params ? "parameter" : "optimizer state", d, into, m->step(ctx),
                                            err, errlen);
        data[i] = into;
    }
    char step[32], scale[32] = "", good[32] = "", skipped[32] = "", interval[32] = "", updates[32] = "";
    snprintf(step, sizeof step, "%" PRId64, m->step(ctx));
    if (servers) snprintf(updates, sizeof updates, "%" PRId64, m->ps_updates(ctx));
    if (ls) {
        snprintf(scale, sizeof scale, "%.17g", ls->scale);
        snprintf(good, sizeof good, "%" PRId64, ls->good_steps);
        snprintf(skipped, sizeof skipped, "%" PRId64, ls->skipped);
        snprintf(interval, sizeof interval, "%" PRId64, ls->interval);
    }
    if (rc == 0 && writer) {
        const char *ckpt_keys[CKPT_OWN_META] = {"dmc.format", "dmc.model", "dmc.step", "dmc.ps_updates", "dmc.loss_scale",
                                                "dmc.loss_scale_good_steps", "dmc.loss_scale_skipped",
                                                "dmc.loss_scale_interval"};
        const char *ckpt_values[CKPT_OWN_META] = {CKPT_FORMAT, m->name, step, updates, scale, good, skipped, interval};
        /* the first three, then the servers' count and the loss scaler's four where there are */
        for (int k = 0; k < CKPT_OWN_META; k++)
            if (k < 3 || (k == 3 && servers) || (k > 3 && ls)) {
                own_keys[n_own] = ckpt_keys[k];
                own_values[n_own] = ckpt_values[k];
                n_own++;
            }
        for (int k = 0; k < n_meta; k++) own_keys[n_own + k] = keys[k], own_values[n_own + k] = values[k];
        if (dmrt_file_meta_with_crc32c(&meta, n_own + n_meta, own_keys, own_values, n, descs, data) != 0)
            rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
        else
            rc = dmrt_st_write_meta(path, n, descs, data, meta.n, meta.keys, meta.values, err, errlen);
    }
    dmrt_file_meta_free(&meta);
    for (int i = 0; whole && i < n; i++) dmrt_free(whole[i]);
    free(whole);
    free(data);
    free(descs);
    free(own_keys);
    free(own_values);
    return rc;
}

int dmrt_file_meta_with_crc32c(dmrt_file_meta *meta, int n_own, const char *const *own_keys,
                               const char *const *own_values, int n, const dmrt_tensor_desc *descs,
                               const void *const *data) {
    *meta = (dmrt_file_meta){0};
    /* every checksum's key and value in one block: "dmc.crc32c.<name>\0" and 8 digits and a NUL */
    size_t text = 1;
    for (int i = 0; i < n; i++) text += strlen(CKPT_CRC_PREFIX) + strlen(descs[i].name) + 1 + 9;
    meta->keys = calloc((size_t)(n_own + n) + 1, sizeof *meta->keys);
    meta->values = calloc((size_t)(n_own + n) + 1, sizeof *meta->values);
    meta->text = malloc(text);
    if (!meta->keys || !meta->values || !meta->text) {
        dmrt_file_meta_free(meta);
        return -1;
    }
    for (int k = 0; k < n_own; k++) meta->keys[k] = own_keys[k], meta->values[k] = own_values[k];
    char *at = meta->text;
    for (int i = 0; i < n; i++) {
        int key_len = sprintf(at, CKPT_CRC_PREFIX "%s", descs[i].name);
        meta->keys[n_own + i] = at;
        at += key_len + 1;
        /* (a tensor without data is the writer's to refuse, naming it) */
        size_t bytes = data[i] ? (size_t)descs[i].numel * dmrt_dtype_size(descs[i].dtype) : 0;
        dmrt_crc32c_hex(dmrt_crc32c(0, data[i], bytes), at);
        meta->values[n_own + i] = at;
        at += 9;
    }
    meta->n = n_own + n;
    return 0;
}

void dmrt_file_meta_free(dmrt_file_meta *meta) {
    free(meta->keys);
    free(meta->values);
    free(meta->text);
    *meta = (dmrt_file_meta){0};
}

/* A count in the metadata (s, which may be NULL): digits only (no sign or space), below
 * INT64_MAX, so that counting on from it cannot overflow. 0 and *v, or -1. */
static int metadata_count(const char *s, int64_t *v) {
    if (!s || !isdigit((unsigned char)s[0])) return -1;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end || x == INT64_MAX) return -1;
    *v = x;
    return 0;
}

/* The file's "dmc.step": 0 and *step, or -1 with a message. *checksummed: whether the format
 * gives every tensor a CRC-32C (2; 1 did not). */
static int read_step(const dmrt_st_file *f, int64_t *step, int *checksummed, char *err, size_t errlen) {
    const char *format = dmrt_st_meta(f, "dmc.format"), *s = dmrt_st_meta(f, "dmc.step");
    if (!format)
        return dmrt_errorf(err, errlen,
                           "%s: not a checkpoint (no \"dmc.format\" in its metadata): a weights file loads with "
                           "--init, not --resume",
                           f->path);
    *checksummed = strcmp(format, CKPT_FORMAT) == 0;
    if (!*checksummed && strcmp(format, CKPT_FORMAT_1) != 0)
        return dmrt_errorf(err, errlen,
                           "%s: checkpoint format '%s', this runtime reads '" CKPT_FORMAT "' and '" CKPT_FORMAT_1 "'",
                           f->path, format);
    if (metadata_count(s, step) != 0)
        return dmrt_errorf(err, errlen, "%s: metadata \"dmc.step\" is %s%s%s, not a count of updates", f->path,
                           s ? "'" : "missing", s ? s : "", s ? "'" : "");
    return 0;
}

/* Whether the file's loss scaler doubles after the program's interval of clean steps: the
 * interval decides when the scale doubles, so another one would not continue the run (and
 * its clean steps may already be past this program's interval). A file without
 * "dmc.loss_scale_interval" (written before checkpoints held it) passes here; its clean
 * steps are checked against the program's interval below. 0, or -1 with a message. */
static int check_loss_scale_interval(const dmrt_st_file *f, const dmrt_loss_scale *ls, char *err, size_t errlen) {
    const char *interval = dmrt_st_meta(f, "dmc.loss_scale_interval");
    int64_t i = 0;
    if (!interval) return 0;
    if (metadata_count(interval, &i) != 0 || i == 0)
        return dmrt_errorf(err, errlen, "%s: metadata \"dmc.loss_scale_interval\" is '%s', not a count of clean steps",
                           f->path, interval);
    if (i != ls->interval)
        return dmrt_errorf(err, errlen,
                           "%s: the checkpoint's loss scaler doubles its scale after %" PRId64 " clean steps, this "
                           "program's after %" PRId64 ": resume with the program compiled with --loss-scale-interval "
                           "%" PRId64 ", or start from its parameters with --init",
                           f->path, i, ls->interval, i);
    return 0;
}

/* fp16's loss scaler from the file's metadata into *ls, where it has one (a checkpoint of a
 * run without loss scaling leaves the program's initial scale): a positive finite scale,
 * clean steps below the program's interval (at the interval it would have doubled), skips
 * a count. 0, or -1 with a message and *ls untouched. */
static int read_loss_scale(const dmrt_st_file *f, dmrt_loss_scale *ls, char *err, size_t errlen) {
    const char *scale = dmrt_st_meta(f, "dmc.loss_scale"), *good = dmrt_st_meta(f, "dmc.loss_scale_good_steps"),
               *skipped = dmrt_st_meta(f, "dmc.loss_scale_skipped");
    if (!scale) return 0;
    if (check_loss_scale_interval(f, ls, err, errlen) != 0) return -1;
    char *end = NULL;
    double s = strtod(scale, &end);
    int64_t g = 0, k = 0;
    /* at its own interval (recorded, and the program's) the scale would have doubled */
    int recorded = dmrt_st_meta(f, "dmc.loss_scale_interval") != NULL;
    if (end == scale || *end || !(s > 0 && s < 1e300) || (good && metadata_count(good, &g) != 0) ||
        (skipped && metadata_count(skipped, &k) != 0) || (recorded && g >= ls->interval))
        return dmrt_errorf(err, errlen, "%s: metadata \"dmc.loss_scale\" is '%s' (good steps '%s', skipped '%s'): not a "
                           "loss scaler's state (clean steps below the interval %" PRId64 ")", f->path, scale,
                           good ? good : "", skipped ? skipped : "", ls->interval);
    /* a file of before "dmc.loss_scale_interval" past the program's: its program's was larger */
    if (ls->interval > 0 && g >= ls->interval)
        return dmrt_errorf(err, errlen,
                           "%s: the checkpoint's loss scaler has had %" PRId64 " clean steps since its scale last "
                           "changed, this program's doubles it after %" PRId64 ": the checkpoint was written by a "
                           "program with a larger --loss-scale-interval; resume with that program, or start from its "
                           "parameters with --init",
                           f->path, g, ls->interval);
    ls->scale = s, ls->good_steps = g, ls->skipped = k, ls->last_skipped = 0;
    return 0;
}

/* Whether tensor name is one of the program's parameters or optimizer states. */
static int reads_tensor(const dmrt_model *m, const char *name) {
    for (int i = 0; i < m->n_params + m->n_states; i++)
        if (strcmp(ckpt_desc(m, i)->name, name) == 0) return 1;
    return 0;
}

/* Whether the file is a checkpoint of this program, beyond its tensors' names and shapes
 * (dmrt_check_tensor checks those the program reads): the same model (another one's
 * tensors may share names and shapes), a loss scaler where the file has one (the program
 * without one would count fp16's skipped updates as done: AdamW's bias correction of
 * another step), and no tensor the program would leave behind (another optimizer's state,
 * a --prune mask: silently dropped, the run would not continue). 0, or -1 with a message. */
static int check_same_program(const dmrt_model *m, const dmrt_st_file *f, char *err, size_t errlen) {
    const char *model = dmrt_st_meta(f, "dmc.model"), *skipped = dmrt_st_meta(f, "dmc.loss_scale_skipped");
    if (model && strcmp(model, m->name) != 0)
        return dmrt_errorf(err, errlen,
                           "%s: a checkpoint of model '%s', this program is model '%s': resume with the program of "
                           "model '%s' (if it is the same model renamed, compiling with --name %s makes the names "
                           "agree), or start from its parameters with --init",
                           f->path, model, m->name, model, model);
    if (dmrt_st_meta(f, "dmc.loss_scale") && !m->loss_scale)
        return dmrt_errorf(err, errlen,
                           "%s: a checkpoint of an fp16 program (its loss scaler's state, metadata \"dmc.loss_scale\"; "
                           "updates skipped: %s), and this program has no loss scaler, whose optimizer would count the "
                           "skipped updates as done: resume with the program compiled with --precision fp16, or start "
                           "from its parameters with --init",
                           f->path, skipped ? skipped : "not recorded");
    for (int j = 0; j < f->n_tensors; j++)
        if (!reads_tensor(m, f->tensors[j].name))
            return dmrt_errorf(err, errlen,
                               "%s: tensor '%s' is not one this program reads (another optimizer's state, a --prune "
                               "mask, or --compress topk's or powersgd's error feedback: the checkpoint was written by "
                               "a program compiled with another optimizer, --prune or --compress), and resuming would "
                               "drop it: resume with that program, or start from its parameters with --init",
                               f->path, f->tensors[j].name);
    return 0;
}

static dmrt_state_layout layout_of(const dmrt_model *m, int i) {
    return i < m->n_params || !m->state_layouts ? DMRT_STATE_WHOLE : (dmrt_state_layout)m->state_layouts[i - m->n_params];
}

/* How tensor i of the checkpoint loads from f (dmrt_state_layout): as the file holds it, as
 * rows redistributed over this program's data ranks, as zeros, or not at all. */
typedef enum { LOAD_AS_IS, LOAD_REDISTRIBUTED, LOAD_ZEROS, LOAD_SKIPPED } load_how;

static load_how how_to_load(const dmrt_model *m, int i, const dmrt_st_tensor *t) {
    const dmrt_tensor_desc *d = ckpt_desc(m, i);
    dmrt_state_layout layout = layout_of(m, i);
    int same = t && t->dtype == d->dtype && t->rank == d->rank &&
               memcmp(t->shape, d->shape, sizeof(int64_t) * (size_t)d->rank) == 0;
    if (layout == DMRT_STATE_WARM_START) return same ? LOAD_AS_IS : LOAD_SKIPPED;
    if (layout != DMRT_STATE_PER_DATA_RANK || same) return LOAD_AS_IS;
    if (!t) return LOAD_ZEROS;
    /* the same tensor per row, another number of rows: the file's data-axis size differs */
    int rows_only = t->dtype == d->dtype && t->rank == d->rank && t->rank >= 1 && t->shape[0] >= 1 &&
                    memcmp(t->shape + 1, d->shape + 1, sizeof(int64_t) * (size_t)(d->rank - 1)) == 0;
    return rows_only ? LOAD_REDISTRIBUTED : LOAD_AS_IS; /* (as is: its shape check fails, naming both) */
}

/* The file's rows [R, n] as this program's [rows, n]: each row the file's rows' sum (in
 * their order) over rows. NULL when out of memory. */
static float *redistributed_rows(const dmrt_st_tensor *t, const dmrt_tensor_desc *d) {
    int64_t rows = d->shape[0], per_row = d->numel / rows, file_rows = t->shape[0];
    float *out = dmrt_alloc((size_t)d->numel * sizeof(float));
    if (!out) return NULL;
    for (int64_t e = 0; e < per_row; e++) {
        float sum = 0;
        for (int64_t r = 0; r < file_rows; r++) {
            float v;
            memcpy(&v, (const char *)t->data + (size_t)(r * per_row + e) * sizeof v, sizeof v);
            sum += v;
        }
        out[e] = sum / (float)rows;
    }
    for (int64_t r = 1; r < rows; r++) memcpy(out + r * per_row, out, (size_t)per_row * sizeof(float));
    return out;
}

/* Tensor i of f checked (present, dtype, shape, checksum, finite) as how loads it. */
static int check_source(const dmrt_model *m, const dmrt_st_file *f, int i, const dmrt_st_tensor *t, load_how how,
                        int checksummed, char *err, size_t errlen) {
    const dmrt_tensor_desc *d = ckpt_desc(m, i);
    const char *what = i < m->n_params ? "parameter" : "optimizer state";
    if (how == LOAD_ZEROS || (how == LOAD_SKIPPED && !t)) return 0;
    dmrt_tensor_desc as_filed = *d; /* a tensor loaded otherwise is checked in the file's shape */
    if (how != LOAD_AS_IS) {
        as_filed.rank = t->rank;
        memcpy(as_filed.shape, t->shape, sizeof as_filed.shape);
        as_filed.numel = t->numel;
    }
    if (how == LOAD_AS_IS && dmrt_check_tensor(m, f->path, t, d, what, NULL, err, errlen) != 0) return -1;
    if (dmrt_check_crc32c(f, t, checksummed, err, errlen) != 0) return -1;
    if (t->dtype != DMRT_F32) return 0; /* (a skipped one of another dtype is never read) */
    return dmrt_check_finite_to_load(f->path, t, &as_filed, what, err, errlen);
}

/* Tensor i into the program from its source as how says. */
static int load_tensor(const dmrt_model *m, void *ctx, int i, const dmrt_st_tensor *t, load_how how) {
    const dmrt_tensor_desc *d = ckpt_desc(m, i);
    if (how == LOAD_SKIPPED) return DMRT_OK;
    if (i < m->n_params) {
        if (m->scatter) return m->scatter(ctx, i, t->data);
        memcpy(m->param(ctx, i), t->data, (size_t)d->numel * sizeof(float));
        return DMRT_OK;
    }
    if (how == LOAD_AS_IS) return m->state_scatter(ctx, i - m->n_params, t->data);
    float *rows = how == LOAD_ZEROS ? dmrt_alloc((size_t)d->numel * sizeof(float)) : redistributed_rows(t, d);
    if (!rows) return DMRT_ERR_NOMEM;
    if (how == LOAD_ZEROS) memset(rows, 0, (size_t)d->numel * sizeof(float));
    int status = m->state_scatter(ctx, i - m->n_params, rows);
    dmrt_free(rows);
    return status;
}

/* Appends a clause to buf (len bytes), "; " before all but the first; n: its length so far. */
static size_t append_clause(char *buf, size_t len, size_t n, const char *clause) {
    if (!len || n >= len - 1) return n;
    int k = snprintf(buf + n, len - n, "%s%s", n ? "; " : "", clause);
    return k < 0 ? n : (n + (size_t)k < len ? n + (size_t)k : len - 1);
}

size_t dmrt_checkpoint_adapted(const dmrt_model *m, const dmrt_st_file *f, char *buf, size_t len) {
    int redistributed = 0, zeros = 0, skipped = 0;
    int64_t file_rows = 0, rows = 0;
    for (int i = m->n_params; i < m->n_params + m->n_states; i++) {
        const dmrt_st_tensor *t = dmrt_st_find(f, ckpt_desc(m, i)->name);
        switch (how_to_load(m, i, t)) {
        case LOAD_REDISTRIBUTED:
            redistributed++, file_rows = t->shape[0], rows = ckpt_desc(m, i)->shape[0];
            break;
        case LOAD_ZEROS: zeros++; break;
        case LOAD_SKIPPED: skipped++; break;
        default: break;
        }
    }
    char clause[256];
    size_t n = 0;
    if (len) buf[0] = 0;
    if (redistributed) {
        snprintf(clause, sizeof clause,
                 "the error feedback of %d gradients was written by %" PRId64 " data ranks and this run has %" PRId64
                 ": each rank starts from their sum over %" PRId64,
                 redistributed, file_rows, rows, rows);
        n = append_clause(buf, len, n, clause);
    }
    if (zeros) {
        snprintf(clause, sizeof clause,
                 "the file holds no error feedback for %d gradients (written without --compress topk or powersgd): "
                 "it starts from zeros",
                 zeros);
        n = append_clause(buf, len, n, clause);
    }
    if (skipped) {
        snprintf(clause, sizeof clause,
                 "PowerSGD's factors of %d gradients are missing from the file or of another mesh: this run keeps "
                 "its own, drawn from its seed",
                 skipped);
        n = append_clause(buf, len, n, clause);
    }
    return n;
}

int dmrt_load_checkpoint_file(const dmrt_model *m, void *ctx, const dmrt_st_file *f, char *err, size_t errlen) {
    const char *path = f->path;
    if (!m->checkpoints || !m->set_step)
        return dmrt_errorf(err, errlen, "%s: model '%s' cannot read checkpoints: %s", path, m->name,
                           m->checkpoints_unsupported ? m->checkpoints_unsupported : "it does not say how");
    int n = m->n_params + m->n_states, rc = 0, checksummed = 0;
    int64_t step = 0;
    const dmrt_st_tensor **source = calloc(n ? (size_t)n : 1, sizeof *source);
    load_how *how = calloc(n ? (size_t)n : 1, sizeof *how);
    if (!source || !how) rc = dmrt_errorf(err, errlen, "%s: out of memory", path);
    if (rc == 0) rc = read_step(f, &step, &checksummed, err, errlen);
    if (rc == 0) rc = check_same_program(m, f, err, errlen);
    /* everything checked before anything changes (the loss scaler read into a copy) */
    dmrt_loss_scale scaler = {0};
    if (m->loss_scale) scaler = *m->loss_scale(ctx);
    if (rc == 0 && m->loss_scale) rc = read_loss_scale(f, &scaler, err, errlen);
    /* the parameter servers' updates: a file of a program without servers, its optimizer's
     * (its step, less fp16's skipped updates) */
    const char *ps_updates = dmrt_st_meta(f, "dmc.ps_updates");
    int64_t updates = step, skipped = 0;
    if (!ps_updates && metadata_count(dmrt_st_meta(f, "dmc.loss_scale_skipped"), &skipped) == 0 && skipped <= step)
        updates = step - skipped;
    if (rc == 0 && ps_updates && metadata_count(ps_updates, &updates) != 0)
        rc = dmrt_errorf(err, errlen, "%s: metadata \"dmc.ps_updates\" is '%s', not a count of updates", path, ps_updates);
    for (int i = 0; i < n && rc == 0; i++) {
        source[i] = dmrt_st_find(f, ckpt_desc(m, i)->name);
        how[i] = how_to_load(m, i, source[i]);
        rc = check_source(m, f, i, source[i], how[i], checksummed, err, errlen);
    }
    /* every tensor checked; the servers' count first (it refuses once they have started, and
     * then nothing else has changed) */
    if (rc == 0 && m->param_servers && m->set_ps_updates && m->set_ps_updates(ctx, updates) != DMRT_OK)
        rc = dmrt_errorf(err, errlen, "%s: the parameter servers' %" PRId64 " updates: %s", path, updates, m->error(ctx));
    for (int i = 0; i < n && rc == 0; i++) {
        int status = load_tensor(m, ctx, i, source[i], how[i]);
        if (status == DMRT_ERR_NOMEM) rc = dmrt_errorf(err, errlen, "%s: loading '%s': out of memory", path, ckpt_desc(m, i)->name);
        else if (status != DMRT_OK)
            rc = dmrt_errorf(err, errlen, "%s: loading '%s': %s", path, ckpt_desc(m, i)->name, m->error(ctx));
    }
    if (rc == 0 && m->set_step(ctx, step) != DMRT_OK)
        rc = dmrt_errorf(err, errlen, "%s: step %" PRId64 ": %s", path, step, m->error(ctx));
    if (rc == 0 && m->loss_scale) *m->loss_scale(ctx) = scaler;
    free(source);
    free(how);
    return rc;
}

int dmrt_check_crc32c(const dmrt_st_file *f, const dmrt_st_tensor *t, int required, char *err, size_t errlen) {
    char key[1024], hex[9];
    if (snprintf(key, sizeof key, CKPT_CRC_PREFIX "%s", t->name) >= (int)sizeof key)
        return dmrt_errorf(err, errlen, "%s: tensor '%s': name too long", f->path, t->name);
    const char *stored = dmrt_st_meta(f, key);
    if (!stored) {
        if (!required) return 0;
        return dmrt_errorf(err, errlen,
                           "%s: tensor '%s' has no CRC-32C (metadata \"%s\"), which every tensor of a '" CKPT_FORMAT
                           "' file has: the file is corrupt or was altered",
                           f->path, t->name, key);
    }
    dmrt_crc32c_hex(dmrt_crc32c(0, t->data, (size_t)t->numel * dmrt_dtype_size(t->dtype)), hex);
    if (strcmp(stored, hex) != 0)
        return dmrt_errorf(err, errlen,
                           "%s: tensor '%s' fails its CRC-32C check (stored %s, computed %s): the file is corrupt",
                           f->path, t->name, stored, hex);
    return 0;
}

int dmrt_load_checkpoint(const dmrt_model *m, void *ctx, const char *path, dmrt_st_file *file, char *err,
                         size_t errlen) {
    dmrt_st_file f;
    if (dmrt_st_read(&f, path, err, errlen) != 0) return -1;
    int rc = dmrt_load_checkpoint_file(m, ctx, &f, err, errlen);
    if (rc == 0 && file) *file = f;
    else dmrt_st_close(&f);
    return rc;
}

/* ---- the trainer's directory of checkpoints ------------------------------------------------ */

int dmrt_checkpoint_path(const char *dir, int64_t step, char *buf, size_t len) {
    int k = snprintf(buf, len, "%s/" CKPT_PREFIX "%08" PRId64 CKPT_SUFFIX, dir, step);
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

/* The step of a file named step-<digits>.safetensors, or -1. */
static int64_t name_step(const char *name) {
    size_t np = strlen(CKPT_PREFIX), ns = strlen(CKPT_SUFFIX), len = strlen(name);
    if (len <= np + ns || strncmp(name, CKPT_PREFIX, np) != 0 || strcmp(name + len - ns, CKPT_SUFFIX) != 0) return -1;
    int64_t step = 0;
    for (size_t i = np; i < len - ns; i++) {
        if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

/* The step of a file named as the trainer names checkpoints (step-%08d: an unpadded
 * step-3.safetensors would be read, and pruned, as step-00000003.safetensors), or -1. */
static int64_t checkpoint_name_step(const char *name) {
    int64_t s = name_step(name);
    char canonical[64];
    if (s < 0) return -1;
    snprintf(canonical, sizeof canonical, CKPT_PREFIX "%08" PRId64 CKPT_SUFFIX, s);
    return strcmp(canonical, name) == 0 ? s : -1;
}

int64_t dmrt_checkpoint_file_step(const char *dir, const char *path) {
    char parent[4096];
    const char *slash = strrchr(path, '/');
    int64_t step = checkpoint_name_step(slash ? slash + 1 : path);
    if (step < 0 || dmrt_parent_dir(path, parent, sizeof parent) != 0) return -1;
    return dmrt_same_file(parent, dir) ? step : -1;
}

/* Whether name is a checkpoint write's temporary file: a checkpoint's name, then ".tmp." and
 * mkstemp's six characters (dmrt_temporary_beside). */
static int unfinished_name(const char *name) {
    const char *tmp = strstr(name, CKPT_SUFFIX ".tmp.");
    if (!tmp) return 0;
    size_t base = (size_t)(tmp - name) + strlen(CKPT_SUFFIX);
    char checkpoint[256];
    if (base >= sizeof checkpoint || strlen(tmp + strlen(CKPT_SUFFIX ".tmp.")) != 6) return 0;
    memcpy(checkpoint, name, base);
    checkpoint[base] = '\0';
    return checkpoint_name_step(checkpoint) >= 0;
}

static int compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int dmrt_checkpoint_remove_unfinished(const char *dir, char *removed, size_t len, char *err, size_t errlen) {
    removed[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return dmrt_errorf(err, errlen, "%s: cannot open the directory: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0, rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (!unfinished_name(de->d_name)) continue;
        if (n == cap) {
            char **grown = realloc(names, (size_t)(cap = cap ? 2 * cap : 8) * sizeof *names);
            if (!grown) {
                rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
                break;
            }
            names = grown;
        }
        if (!(names[n] = strdup(de->d_name))) rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
        else n++;
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, compare_names); /* the message in a stable order */
    int count = 0;
    size_t used = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) >= (int)sizeof path) continue;
        /* a file mkstemp made; anything else of such a name (a link, a directory) is not one */
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (unlink(path) != 0) {
            rc = dmrt_errorf(err, errlen, "%s: cannot remove the unfinished checkpoint file: %s", path, strerror(errno));
            break;
        }
        int k = snprintf(removed + used, len - used, "%s%s", count ? ", " : "", names[i]);
        if (k > 0) used = used + (size_t)k < len ? used + (size_t)k : len - 1;
        count++;
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc == 0 ? count : -1;
}


/* dir's checkpoints, ascending by step, malloc'd into *out with each one's run (its header's
 * DMRT_CKPT_RUN_KEY: the data are not read); how many, or -1. */
int dmrt_checkpoint_list(const char *dir, dmrt_ckpt_entry **out, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return dmrt_errorf(err, errlen, "%s: cannot open the directory: %s", dir, strerror(errno));
    int n = 0, cap = 0, rc = 0;
    dmrt_ckpt_entry *e = NULL;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        int64_t s = checkpoint_name_step(de->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            dmrt_ckpt_entry *grown = realloc(e, (size_t)cap * sizeof *e);
            if (!grown) {
                rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
                break;
            }
            e = grown;
        }
        memset(&e[n], 0, sizeof e[n]);
        e[n++].step = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a directory holds few */
        for (int j = i; j > 0 && e[j - 1].step > e[j].step; j--) {
            dmrt_ckpt_entry t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    for (int i = 0; i < n && rc == 0; i++) {
        dmrt_st_file f;
        char why[1024];
        struct stat st;
        if (dmrt_checkpoint_path(dir, e[i].step, e[i].path, sizeof e[i].path) != 0) {
            rc = dmrt_errorf(err, errlen, "%s: path too long", dir);
        } else if (stat(e[i].path, &st) == 0 && !S_ISREG(st.st_mode)) {
            /* a directory or a FIFO of that name: not read (opening a FIFO would wait) */
            snprintf(why, sizeof why, "%s: not a regular file", e[i].path);
            e[i].not_a_file = 1;
            if (!(e[i].unreadable = strdup(why))) rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
        } else if (dmrt_st_read_meta(&f, e[i].path, why, sizeof why) != 0) {
            if (!(e[i].unreadable = strdup(why))) rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
        } else {
            const char *run = dmrt_st_meta(&f, DMRT_CKPT_RUN_KEY);
            if (run && *run && !(e[i].run = strdup(run))) rc = dmrt_errorf(err, errlen, "%s: out of memory", dir);
            dmrt_st_close(&f);
        }
    }
    if (rc != 0) {
        dmrt_checkpoint_list_free(e, n);
        return -1;
    }
    *out = e;
    return n;
}

void dmrt_checkpoint_list_free(dmrt_ckpt_entry *e, int n) {
    for (int i = 0; e && i < n; i++) {
        free(e[i].run);
        free(e[i].unreadable);
    }
    free(e);
}

int dmrt_checkpoint_of_run(const dmrt_ckpt_entry *e, const char *run) {
    if (e->unreadable) return 0;
    return run ? e->run && strcmp(e->run, run) == 0 : !e->run;
}

size_t dmrt_checkpoint_describe(char *buf, size_t len, const dmrt_ckpt_entry *e) {
    const char *none = "of no named run (written before checkpoints named their run)";
    int k = e->unreadable ? snprintf(buf, len, "%s, unreadable (%s)", e->path, e->unreadable)
            : e->run      ? snprintf(buf, len, "%s of run %s", e->path, e->run)
                          : snprintf(buf, len, "%s, %s", e->path, none);
    return k < 0 ? 0 : (size_t)k >= len ? len ? len - 1 : 0 : (size_t)k;
}

int dmrt_checkpoint_latest(const char *dir, char *path, size_t len, char *err, size_t errlen) {
    dmrt_ckpt_entry *e = NULL;
    int n = dmrt_checkpoint_list(dir, &e, err, errlen);
    if (n < 0) return -1;
    if (n == 0) {
        dmrt_checkpoint_list_free(e, n);
        return dmrt_errorf(err, errlen, "%s: no checkpoint in the directory (files " CKPT_PREFIX "<step>" CKPT_SUFFIX ")",
                           dir);
    }
    /* the newest of each run, newest first: one run is the directory's own; several, a choice
     * that is not the trainer's */
    char runs[2048];
    size_t used = 0;
    int n_runs = 0;
    for (int i = n - 1; i >= 0; i--) {
        int seen = 0;
        for (int j = i + 1; j < n && !seen; j++)
            seen = !e[i].unreadable && dmrt_checkpoint_of_run(&e[j], e[i].run);
        if (seen) continue;
        n_runs++;
        if (used + 3 < sizeof runs) {
            if (n_runs > 1) runs[used++] = ';', runs[used++] = ' ';
            used += dmrt_checkpoint_describe(runs + used, sizeof runs - used, &e[i]);
        }
    }
    int rc = 0;
    if (n_runs > 1)
        rc = dmrt_errorf(err, errlen,
                         "%s: the directory holds the checkpoints of %d runs (the newest of each: %s): name the "
                         "checkpoint file to resume",
                         dir, n_runs, runs);
    else if (e[n - 1].not_a_file)
        rc = dmrt_errorf(err, errlen, "%s: the newest checkpoint is %s", dir, e[n - 1].unreadable);
    else if ((size_t)snprintf(path, len, "%s", e[n - 1].path) >= len)
        rc = dmrt_errorf(err, errlen, "%s: path too long", dir);
    dmrt_checkpoint_list_free(e, n);
    return rc;
}

int dmrt_checkpoint_prune(const char *dir, int keep, const char *run, char *err, size_t errlen) {
    dmrt_ckpt_entry *e = NULL;
    int n = dmrt_checkpoint_list(dir, &e, err, errlen);
    if (n < 0) return -1;
    int rc = 0, ours = 0;
    for (int i = 0; i < n; i++) ours += dmrt_checkpoint_of_run(&e[i], run);
    /* the oldest of run's own; every other file stays */
    for (int i = 0; i < n && ours > keep && rc == 0; i++) {
        if (!dmrt_checkpoint_of_run(&e[i], run)) continue;
        if (remove(e[i].path) != 0 && errno != ENOENT)
            rc = dmrt_errorf(err, errlen, "%s: cannot remove an old checkpoint: %s", e[i].path, strerror(errno));
        ours--;
    }
    dmrt_checkpoint_list_free(e, n);
    return rc;
}
