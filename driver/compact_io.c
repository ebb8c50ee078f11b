/* compact_io.c: --compact's files (compact_io.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "compact_io.h"
#include "dmrt.h"

struct dm_compact_input {
    dmrt_st_file file;
    dm_file_tensor *tensors;
};

dm_compact_input *dm_compact_open(const char *path, dm_compaction *c) {
    dm_compact_input *in = calloc(1, sizeof *in);
    if (!in) abort();
    char err[512];
    if (dmrt_st_read(&in->file, path, err, sizeof err)) {
        fprintf(stderr, "dmc: error: --compact %s\n", err);
        free(in);
        return NULL;
    }
    in->tensors = calloc((size_t)in->file.n_tensors + 1, sizeof *in->tensors);
    if (!in->tensors) abort();
    for (int i = 0; i < in->file.n_tensors; i++) {
        const dmrt_st_tensor *t = &in->file.tensors[i];
        dm_file_tensor *f = &in->tensors[i];
        f->name = t->name;
        f->f32 = t->dtype == DMRT_F32;
        f->rank = t->rank;
        for (int k = 0; k < t->rank && k < IR_MAX_RANK; k++) f->shape[k] = t->shape[k];
        f->data = t->data;
    }
    c->path = path;
    c->file = in->tensors;
    c->n_file = in->file.n_tensors;
    return in;
}

void dm_compact_close(dm_compact_input *in) {
    if (!in) return;
    dmrt_st_close(&in->file);
    free(in->tensors);
    free(in);
}

/* Weights that are not finite are never written: a fold of finite ones (c_j * W2[j, :] added
 * to a bias) can still overflow. 0, or 1 with the message naming the file and the tensor. */
static int compacted_finite(const dm_compaction *c, const dmrt_tensor_desc *descs, const char *path) {
    for (int i = 0; i < c->n_weights; i++)
        for (int64_t k = 0; k < descs[i].numel; k++)
            if (!isfinite(c->weights[i].data[k])) {
                fprintf(stderr, "dmc: error: --compact: %s not written: tensor '%s' holds a non-finite value after "
                        "compaction (%g at element %lld)\n", path, c->weights[i].name, (double)c->weights[i].data[k],
                        (long long)k);
                return 1;
            }
    return 0;
}

int dm_compact_save(const dm_compaction *c, const char *path) {
    dmrt_tensor_desc *descs = calloc((size_t)c->n_weights + 1, sizeof *descs);
    const void **data = calloc((size_t)c->n_weights + 1, sizeof *data);
    if (!descs || !data) abort();
    for (int i = 0; i < c->n_weights; i++) {
        const dm_weight *w = &c->weights[i];
        descs[i] = (dmrt_tensor_desc){.name = w->name, .dtype = DMRT_F32, .rank = w->rank, .numel = 1};
        for (int k = 0; k < w->rank; k++) descs[i].shape[k] = w->shape[k], descs[i].numel *= w->shape[k];
        data[i] = w->data;
    }
    const char *keys[] = {"dmc.compacted_from"}, *values[] = {c->path};
    char err[512];
    int rc = compacted_finite(c, descs, path);
    if (!rc && (rc = dmrt_st_write_meta(path, c->n_weights, descs, data, 1, keys, values, err, sizeof err)) != 0)
        fprintf(stderr, "dmc: error: --compact: writing the compacted weights: %s\n", err);
    free(descs);
    free(data);
    return rc ? 1 : 0;
}
