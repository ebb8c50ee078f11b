/* test_quantize_sync: runtime/quantize_io.c on a quantized model whose storage the host
 * cannot address, as the CUDA target's (its parameters reached only through gather and
 * scatter, its narrow weight's products reading a copy that qweight_sync refreshes). A
 * hand-written model stands in for the device: parameters in a private array that only
 * gather/scatter touch (param returns NULL), and a "device" copy of the int8 weight.
 *   - --init of an f32 file: the weight quantized from the scattered values, its f32
 *     parameter set to the dequantized ones (through scatter), the device copy synced;
 *   - --save-quantized: the narrow tensors, and the f32 bias gathered, in the file;
 *   - --init of that file into a zeroed context: everything back, through scatter and
 *     qweight_sync, the same bytes as the direct quantization;
 *   - --save-quantized of a NaN bias, an infinite or a negative scale: refused, naming the
 *     tensor, and no file written;
 *   - the same with the weight held narrow only (qweight's narrow_only: no f32 parameter,
 *     gather dequantizes it, scatter quantizes and uploads it, as the CUDA target's
 *     int8-weights and int4-weights programs do): --init of the f32 file and of the saved
 *     file leave the device copy the direct quantization's;
 *   - the file's "dmc.crc32c.<name>" of every tensor (dmrt_crc32c of its bytes as stored), a
 *     flipped bit refused by its --init, and a negative scale refused by --init where the file
 *     has no checksums (written by another tool). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "crc32c.h"
#include "dmrt.h"
#include "testutil.h"

#define ROWS 5
#define COLS 3

typedef struct {
    float weight[ROWS * COLS], bias[COLS]; /* "device" parameters */
    dmrt_qweight q;                        /* the host copy */
    int8_t device_data[ROWS * COLS];       /* what the products read */
    float device_scale[COLS];
    int syncs, scatters;
    int narrow;                            /* the weight held narrow only: `weight` unused */
} sync_ctx;

static const dmrt_tensor_desc descs[2] = {
    {.name = "fc.weight", .dtype = DMRT_F32, .rank = 2, .shape = {ROWS, COLS}, .numel = ROWS * COLS},
    {.name = "fc.bias", .dtype = DMRT_F32, .rank = 1, .shape = {COLS}, .numel = COLS}};

static float *storage(sync_ctx *c, int i) { return i == 0 ? c->weight : c->bias; }
static void *no_param(void *ctx, int i) { (void)ctx, (void)i; return NULL; }
static int qweight_sync(void *ctx, int i);
static int gather(void *ctx, int i, int grad, float *whole) {
    if (grad) return DMRT_ERR_ARG;
    if (i == 0 && ((sync_ctx *)ctx)->narrow) {
        dmrt_dequantize_param(&((sync_ctx *)ctx)->q, whole);
        return DMRT_OK;
    }
    memcpy(whole, storage(ctx, i), (size_t)descs[i].numel * sizeof(float));
    return DMRT_OK;
}
static int scatter(void *ctx, int i, const float *whole) {
    ((sync_ctx *)ctx)->scatters++;
    if (i == 0 && ((sync_ctx *)ctx)->narrow) {
        dmrt_quantize_weight(&((sync_ctx *)ctx)->q, whole);
        return qweight_sync(ctx, 0);
    }
    memcpy(storage(ctx, i), whole, (size_t)descs[i].numel * sizeof(float));
    return DMRT_OK;
}
static dmrt_qweight *qweight(void *ctx, int i) { return i == 0 ? &((sync_ctx *)ctx)->q : NULL; }
static int qweight_sync(void *ctx, int i) {
    sync_ctx *c = ctx;
    if (i != 0) return DMRT_ERR_ARG;
    memcpy(c->device_data, c->q.data, sizeof c->device_data);
    memcpy(c->device_scale, c->q.scale, sizeof c->device_scale);
    c->syncs++;
    return DMRT_OK;
}
static const char *error_of(void *ctx) { (void)ctx; return "no error"; }

static const dmrt_model model = {.name = "sync", .n_params = 2, .params = descs, .param = no_param, .gather = gather,
                                 .scatter = scatter, .error = error_of, .quantize = "int8-weights", .qweight = qweight,
                                 .qweight_sync = qweight_sync};

static sync_ctx *fresh_of(int narrow) {
    sync_ctx *c = calloc(1, sizeof *c);
    if (!c || dmrt_qweight_init(&c->q, 8, ROWS, COLS, 0) != 0) abort();
    c->narrow = c->q.narrow_only = narrow;
    return c;
}
static sync_ctx *fresh(void) { return fresh_of(0); }

/* The context's device copy and f32 weight as dmrt_quantize_weight of w gives them. */
static int matches(const sync_ctx *c, const float *w, const char *when) {
    int fails = 0;
    dmrt_qweight want;
    float dequantized[ROWS * COLS];
    if (dmrt_qweight_init(&want, 8, ROWS, COLS, 0) != 0) abort();
    dmrt_quantize_weight(&want, w);
    dmrt_dequantize_rows(&want, 0, ROWS, dequantized);
    CHECK(memcmp(c->q.data, want.data, sizeof c->device_data) == 0, "%s: the host integers", when);
    CHECK(memcmp(c->device_data, want.data, sizeof c->device_data) == 0, "%s: the device integers", when);
    CHECK(memcmp(c->device_scale, want.scale, sizeof c->device_scale) == 0, "%s: the device scales", when);
    CHECK(c->narrow || memcmp(c->weight, dequantized, sizeof dequantized) == 0,
          "%s: the f32 weight is not the dequantized one", when);
    dmrt_qweight_free(&want);
    return fails;
}

/* --save-quantized writes nothing its loader would refuse: a NaN bias (gathered), an
 * infinite scale, each named with the path, and no file left. c is restored after. */
static int refuses_non_finite(sync_ctx *c, const char *dir) {
    int fails = 0;
    char path[4096], err[1024];
    tu_path(path, sizeof path, dir, "nonfinite.safetensors");
    const struct {
        float *at;
        float value;
        const char *phrase;
    } cases[] = {{&c->bias[1], NAN, "tensor 'fc.bias' holds a non-finite value (nan at element 1 of [3])"},
                 {&c->q.scale[2], INFINITY, "tensor 'fc.weight.scale' holds a non-finite value (inf at element 2 of [1, 3])"},
                 {&c->q.scale[1], -0.5f, "tensor 'fc.weight.scale' holds a negative scale (-0.5 at element 1 of [1, 3])"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        float was = *cases[k].at;
        *cases[k].at = cases[k].value;
        err[0] = '\0';
        CHECK(dmrt_save_quantized(&model, c, path, err, sizeof err) != 0, "--save-quantized wrote a %g", (double)cases[k].value);
        CHECK_MSG(err, path, cases[k].phrase);
        CHECK(access(path, F_OK) != 0, "--save-quantized left %s after refusing it", path);
        remove(path);
        *cases[k].at = was;
    }
    return fails;
}

/* The saved file's checksums: every tensor's "dmc.crc32c.<name>", the CRC-32C of its bytes. */
static int has_checksums(const char *path) {
    int fails = 0;
    dmrt_st_file f;
    char err[1024], key[300], hex[9];
    if (dmrt_st_read(&f, path, err, sizeof err) != 0) {
        CHECK(0, "reading %s: %s", path, err);
        return fails;
    }
    CHECK(f.n_tensors == 3, "%s holds %d tensors, expected 3", path, f.n_tensors);
    for (int i = 0; i < f.n_tensors; i++) {
        const dmrt_st_tensor *t = &f.tensors[i];
        snprintf(key, sizeof key, "dmc.crc32c.%s", t->name);
        dmrt_crc32c_hex(dmrt_crc32c(0, t->data, (size_t)t->numel * dmrt_dtype_size(t->dtype)), hex);
        const char *stored = dmrt_st_meta(&f, key);
        CHECK(stored && strcmp(stored, hex) == 0, "%s: metadata \"%s\" is %s, the tensor's CRC-32C %s", path, key,
              stored ? stored : "missing", hex);
    }
    dmrt_st_close(&f);
    return fails;
}

/* The file with the sign of its last float flipped (fc.weight.scale[2], the last tensor: a
 * negative scale), and that scale negated in a file without checksums, as another tool would
 * write it: both refused by --init, naming the file and the tensor. */
static int refuses_corrupt(const char *dir, const char *quantized) {
    int fails = 0;
    char flipped[4096], unsummed[4096], err[1024];
    tu_path(flipped, sizeof flipped, dir, "flipped.safetensors");
    tu_path(unsummed, sizeof unsummed, dir, "negative.safetensors");
    FILE *in = fopen(quantized, "rb");
    static unsigned char bytes[1 << 16];
    size_t n = in ? fread(bytes, 1, sizeof bytes, in) : 0;
    if (in) fclose(in);
    CHECK(n > 8 && n < sizeof bytes, "reading %s: %zu bytes", quantized, n);
    if (n <= 8 || n >= sizeof bytes) return fails;
    bytes[n - 1] ^= 0x80;
    FILE *out = fopen(flipped, "wb");
    CHECK(out && fwrite(bytes, 1, n, out) == n && fclose(out) == 0, "writing %s", flipped);
    sync_ctx *c = fresh();
    err[0] = '\0';
    CHECK(dmrt_load_init(&model, c, flipped, err, sizeof err) != 0, "--init of a file with a flipped bit loaded");
    CHECK_MSG(err, flipped, "tensor 'fc.weight.scale' fails its CRC-32C check");

    dmrt_st_file f;
    CHECK(dmrt_st_read(&f, quantized, err, sizeof err) == 0, "reading %s: %s", quantized, err);
    dmrt_tensor_desc d[3];
    const void *data[3];
    float scale[COLS];
    for (int i = 0; i < 3 && i < f.n_tensors; i++) {
        const dmrt_st_tensor *t = &f.tensors[i];
        d[i] = (dmrt_tensor_desc){.name = t->name, .dtype = t->dtype, .rank = t->rank, .numel = t->numel};
        memcpy(d[i].shape, t->shape, sizeof d[i].shape);
        data[i] = t->data;
        if (strcmp(t->name, "fc.weight.scale") == 0) {
            memcpy(scale, t->data, sizeof scale);
            scale[2] = -scale[2];
            data[i] = scale;
        }
    }
    const char *keys[] = {"dmc.format", "dmc.model", "dmc.quantize"};
    const char *values[] = {dmrt_st_meta(&f, "dmc.format"), dmrt_st_meta(&f, "dmc.model"), dmrt_st_meta(&f, "dmc.quantize")};
    CHECK(f.n_tensors == 3 && dmrt_st_write_meta(unsummed, 3, d, data, 3, keys, values, err, sizeof err) == 0,
          "writing %s: %s", unsummed, err);
    dmrt_st_close(&f);
    err[0] = '\0';
    CHECK(dmrt_load_init(&model, c, unsummed, err, sizeof err) != 0, "--init of a file with a negative scale loaded");
    CHECK_MSG(err, unsummed, "tensor 'fc.weight.scale' holds a negative scale (");
    CHECK(c->scatters == 0 && c->syncs == 0, "a refused --init changed the context (%d scatters, %d syncs)", c->scatters,
          c->syncs);
    dmrt_qweight_free(&c->q);
    free(c);
    remove(flipped), remove(unsummed);
    return fails;
}

/* The weight held narrow only: --init of the f32 file quantizes it in scatter (which
 * uploads it), --save-quantized writes it, --init of that file into a fresh context syncs
 * the device copy (nothing else would: no scatter reaches a narrow tensor of the file). */
static int narrow_only(const char *dir, const char *f32, const float *w) {
    int fails = 0;
    char quantized[4096], err[1024];
    sync_ctx *c = fresh_of(1);
    CHECK(dmrt_load_init(&model, c, f32, err, sizeof err) == 0, "narrow only: --init of the f32 file: %s", err);
    fails += matches(c, w, "narrow only: --init of the f32 file");
    tu_path(quantized, sizeof quantized, dir, "narrow.safetensors");
    CHECK(dmrt_save_quantized(&model, c, quantized, err, sizeof err) == 0, "narrow only: --save-quantized: %s", err);
    sync_ctx *d = fresh_of(1);
    CHECK(dmrt_load_init(&model, d, quantized, err, sizeof err) == 0, "narrow only: --init of the saved file: %s", err);
    fails += matches(d, w, "narrow only: --init of the saved file");
    CHECK(d->syncs == 1 && d->scatters == 1, "narrow only: --init of the saved file: %d syncs and %d scatters, expected "
          "1 and 1 (the bias)", d->syncs, d->scatters);
    dmrt_qweight_free(&c->q), dmrt_qweight_free(&d->q);
    free(c), free(d);
    remove(quantized);
    return fails;
}

int main(void) {
    int fails = 0;
    char dir[4096], f32[4096], quantized[4096], err[1024];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    float w[ROWS * COLS], b[COLS] = {0.5f, -1.25f, 2.0f};
    for (int i = 0; i < ROWS * COLS; i++) w[i] = (float)((i * 37) % 23 - 11) / 7.0f;
    const void *values[2] = {w, b};
    CHECK(dmrt_st_write(tu_path(f32, sizeof f32, dir, "w.safetensors"), 2, descs, values, err, sizeof err) == 0, "%s", err);

    sync_ctx *c = fresh();
    CHECK(dmrt_load_init(&model, c, f32, err, sizeof err) == 0, "--init of the f32 file: %s", err);
    fails += matches(c, w, "--init of the f32 file");
    CHECK(c->syncs == 1, "--init of the f32 file: %d syncs, expected 1", c->syncs);
    CHECK(memcmp(c->bias, b, sizeof b) == 0, "--init of the f32 file: the bias");

    tu_path(quantized, sizeof quantized, dir, "q.safetensors");
    CHECK(dmrt_save_quantized(&model, c, quantized, err, sizeof err) == 0, "--save-quantized: %s", err);
    dmrt_st_file file;
    CHECK(dmrt_st_read(&file, quantized, err, sizeof err) == 0, "reading the saved file: %s", err);
    const dmrt_st_tensor *bias = dmrt_st_find(&file, "fc.bias"), *narrow = dmrt_st_find(&file, "fc.weight");
    CHECK(bias && memcmp(bias->data, b, sizeof b) == 0, "the saved file's fc.bias is not the gathered one");
    CHECK(narrow && narrow->dtype == DMRT_I8 && memcmp(narrow->data, c->q.data, sizeof c->device_data) == 0,
          "the saved file's fc.weight is not the narrow weight");
    dmrt_st_close(&file);

    fails += has_checksums(quantized);
    fails += refuses_corrupt(dir, quantized);
    fails += refuses_non_finite(c, dir);

    sync_ctx *d = fresh();
    CHECK(dmrt_load_init(&model, d, quantized, err, sizeof err) == 0, "--init of the saved file: %s", err);
    fails += matches(d, w, "--init of the saved file");
    CHECK(d->syncs == 1 && d->scatters == 2, "--init of the saved file: %d syncs and %d scatters, expected 1 and 2",
          d->syncs, d->scatters);
    CHECK(memcmp(d->bias, b, sizeof b) == 0, "--init of the saved file: the bias");

    fails += narrow_only(dir, f32, w);

    dmrt_qweight_free(&c->q), dmrt_qweight_free(&d->q);
    free(c), free(d);
    tu_rmdir(dir);
    return fails ? 1 : 0;
}
