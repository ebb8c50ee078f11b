/* params_io.c: a model's parameters to and from safetensors files.
 *
 * Loading is all-or-nothing: the whole file is read and every parameter checked
 * (present, dtype, shape) before the first byte is copied into the context, so a
 * bad file leaves the context as it was. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

int dmrt_load_params(const dmrt_model *model, void *ctx, const char *path, char *err,
                     size_t errlen) {
    dmrt_st_file f;
    if (dmrt_st_read(&f, path, err, errlen) != 0) return -1;
    char want[256], got[256];
    int rc = 0;
    for (int i = 0; i < model->n_params && rc == 0; i++) {
        const dmrt_tensor_desc *d = &model->params[i];
        const dmrt_st_tensor *t = dmrt_st_find(&f, d->name);
        dmrt_shape_str(want, sizeof want, d->rank, d->shape);
        if (!t) {
            rc = dmrt_errorf(err, errlen,
                             "%s: parameter '%s' (%s %s) of model '%s' is missing from the file",
                             path, d->name, dmrt_dtype_name(d->dtype), want, model->name);
            break;
        }
        dmrt_shape_str(got, sizeof got, t->rank, t->shape);
        if (t->dtype != d->dtype)
            rc = dmrt_errorf(err, errlen, "%s: tensor '%s': dtype %s but the model expects %s",
                             path, d->name, dmrt_dtype_name(t->dtype), dmrt_dtype_name(d->dtype));
        else if (t->rank != d->rank || memcmp(t->shape, d->shape, sizeof(int64_t) * (size_t)d->rank))
            rc = dmrt_errorf(err, errlen,
                             "%s: tensor '%s': shape %s in the file but the model expects %s",
                             path, d->name, got, want);
        else if (!model->param(ctx, i))
            rc = dmrt_errorf(err, errlen, "%s: model '%s' has no storage for parameter '%s'",
                             path, model->name, d->name);
    }
    if (rc == 0)
        for (int i = 0; i < model->n_params; i++) {
            const dmrt_tensor_desc *d = &model->params[i];
            const dmrt_st_tensor *t = dmrt_st_find(&f, d->name);
            memcpy(model->param(ctx, i), t->data, (size_t)d->numel * dmrt_dtype_size(d->dtype));
        }
    dmrt_st_close(&f);
    return rc;
}

int dmrt_save_params(const dmrt_model *model, void *ctx, const char *path, char *err,
                     size_t errlen) {
    const void **data = calloc(model->n_params ? (size_t)model->n_params : 1, sizeof *data);
    if (!data) return dmrt_errorf(err, errlen, "%s: out of memory", path);
    for (int i = 0; i < model->n_params; i++) data[i] = model->param(ctx, i);
    int rc = dmrt_st_write(path, model->n_params, model->params, data, err, errlen);
    free(data);
    return rc;
}
