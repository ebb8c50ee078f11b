/* hardware.c: hardware descriptions for the cost model: the JSON format, its checks and
 * the presets (docs/cost.md lists the datasheets their numbers come from). */
#include "hardware.h"

#include <errno.h>
#include <math.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The presets, in the file format. Datasheet peaks are dense (no sparsity); efficiencies
 * and latencies are this project's assumptions (`dmc calibrate` measures a CPU machine).
 * The GPUs' overlap is 1: NCCL's kernels run on a stream of their own beside the
 * backward pass's. */
static const char *const preset_names[] = {"nominal", "cpu-2core", "a100-80gb-sxm", "h100-80gb-sxm"};
static const char *const preset_texts[] = {
    /* the single roofline the cost rules used before hardware files: one CPU socket's order
     * of magnitude, every rank on one node */
    "{\"name\": \"nominal\", \"device\": {\"peak_flops\": {\"fp32\": 1e11, \"tf32\": 1e11, \"bf16\": 1e11},"
    " \"memory_bytes\": 1099511627776, \"memory_bandwidth\": 2e10}, \"devices_per_node\": 1048576,"
    " \"intra_node\": {\"bandwidth\": 1e10, \"latency\": 0}, \"inter_node\": {\"bandwidth\": 1e10, \"latency\": 0},"
    " \"efficiency\": {\"matmul\": 1, \"memory\": 1, \"link\": 1}}",
    /* the machine kind this project is developed on: 2 cores of an AMD EPYC, 24 GiB, the
     * threads backend (ranks are threads: a link is a copy through shared memory);
     * OpenBLAS sgemm measured 75 GFLOP/s at n = 2048, numpy copies 16 GB/s */
    "{\"name\": \"cpu-2core\", \"device\": {\"peak_flops\": {\"fp32\": 1.0e11, \"tf32\": 1.0e11, \"bf16\": 1.0e11},"
    " \"memory_bytes\": 25769803776, \"memory_bandwidth\": 2.0e10}, \"devices_per_node\": 2,"
    " \"intra_node\": {\"bandwidth\": 8e9, \"latency\": 5e-6}, \"inter_node\": {\"bandwidth\": 1.25e9, \"latency\": 5e-5},"
    " \"efficiency\": {\"matmul\": 0.75, \"memory\": 0.8, \"link\": 0.8}}",
    /* NVIDIA A100 80GB SXM (datasheet: FP32 19.5, TF32 156, BF16 312 TFLOPS dense; HBM2e
     * 2,039 GB/s; NVLink 3 600 GB/s per GPU, both directions) in a DGX A100 (8 GPUs,
     * NVSwitch; 8 x 200 Gb/s HDR InfiniBand for compute: 25 GB/s per GPU) */
    "{\"name\": \"a100-80gb-sxm\", \"device\": {\"peak_flops\": {\"fp32\": 19.5e12, \"tf32\": 156e12, \"bf16\": 312e12},"
    " \"memory_bytes\": 85899345920, \"memory_bandwidth\": 2.039e12}, \"devices_per_node\": 8,"
    " \"intra_node\": {\"bandwidth\": 300e9, \"latency\": 5e-6}, \"inter_node\": {\"bandwidth\": 25e9, \"latency\": 1e-5},"
    " \"efficiency\": {\"matmul\": 0.7, \"memory\": 0.8, \"link\": 0.8, \"overlap\": 1}}",
    /* NVIDIA H100 80GB SXM (datasheet: FP32 67, TF32 494.7, BF16 989.4 TFLOPS dense; HBM3
     * 3.35 TB/s; NVLink 4 900 GB/s per GPU, both directions) in a DGX H100 (8 GPUs;
     * 8 x 400 Gb/s NDR InfiniBand: 50 GB/s per GPU) */
    "{\"name\": \"h100-80gb-sxm\", \"device\": {\"peak_flops\": {\"fp32\": 67e12, \"tf32\": 494.7e12, \"bf16\": 989.4e12},"
    " \"memory_bytes\": 85899345920, \"memory_bandwidth\": 3.35e12}, \"devices_per_node\": 8,"
    " \"intra_node\": {\"bandwidth\": 450e9, \"latency\": 5e-6}, \"inter_node\": {\"bandwidth\": 50e9, \"latency\": 1e-5},"
    " \"efficiency\": {\"matmul\": 0.7, \"memory\": 0.8, \"link\": 0.8, \"overlap\": 1}}",
};

int dm_hardware_presets(const char *const **names, const char *const **texts) {
    if (names) *names = preset_names;
    if (texts) *texts = preset_texts;
    return (int)(sizeof preset_names / sizeof preset_names[0]);
}

static const char *const precision_names[DM_PRECISIONS] = {"fp32", "tf32", "bf16", "fp16"};

int dm_precision_by_name(const char *name) {
    for (int p = 0; p < DM_PRECISIONS; p++)
        if (strcmp(name, precision_names[p]) == 0) return p;
    return -1;
}

const char *dm_precision_name(dm_precision p) { return p >= 0 && p < DM_PRECISIONS ? precision_names[p] : "?"; }

typedef struct reader {
    const char *source;
    char *err;
    size_t errlen;
    int failed;
} reader;

static void fail(reader *r, const char *fmt, ...) {
    if (r->failed++) return;
    int n = snprintf(r->err, r->errlen, "%s: ", r->source);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < r->errlen) vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Every key of obj must be one of the names: a misspelt field is an error, not a default. */
static void known_fields(reader *r, json_t *obj, const char *where, const char *const *names, int n) {
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        int known = 0;
        for (int i = 0; i < n && !known; i++) known = strcmp(key, names[i]) == 0;
        if (!known) fail(r, "unknown field '%s%s%s'", where, *where ? "." : "", key);
    }
}

static json_t *object(reader *r, json_t *parent, const char *where, const char *key) {
    json_t *v = json_object_get(parent, key);
    if (!v) fail(r, "missing field '%s%s%s' (an object)", where, *where ? "." : "", key);
    else if (!json_is_object(v)) fail(r, "field '%s%s%s' must be an object", where, *where ? "." : "", key);
    return json_is_object(v) ? v : NULL;
}

/* A number at least min (exclusive when strict), at most max (0: no bound). */
static double number(reader *r, json_t *parent, const char *where, const char *key, double min, int strict, double max) {
    json_t *v = parent ? json_object_get(parent, key) : NULL;
    if (!parent) return 0;
    if (!v) {
        fail(r, "missing field '%s%s%s' (a number)", where, *where ? "." : "", key);
        return 0;
    }
    double x = json_is_number(v) ? json_number_value(v) : 0;
    int ok = json_is_number(v) && (strict ? x > min : x >= min) && (max <= 0 || x <= max);
    if (!ok) {
        char bound[96];
        if (max > 0) snprintf(bound, sizeof bound, "in %s%g, %g]", strict ? "(" : "[", min, max);
        else snprintf(bound, sizeof bound, "%s %g", strict ? "above" : "at least", min);
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        fail(r, "field '%s%s%s' must be a number %s, got %s", where, *where ? "." : "", key, bound, text ? text : "?");
        free(text);
    }
    return x;
}

/* [[flops, efficiency], ...] ascending in flops, efficiencies in (0, 1]. */
static void size_curve(reader *r, json_t *parent, const char *where, const char *key, dm_size_curve *c) {
    json_t *v = json_object_get(parent, key);
    c->n = 0;
    if (!v) return;
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    if (n < 1 || n > DM_SIZE_POINTS) {
        fail(r, "field '%s.%s' must be an array of 1 to %d [flops, efficiency] pairs", where, key, DM_SIZE_POINTS);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *pair = json_array_get(v, i);
        json_t *f = json_array_get(pair, 0), *e = json_array_get(pair, 1);
        double flops = json_number_value(f), eff = json_number_value(e);
        if (!json_is_array(pair) || json_array_size(pair) != 2 || !json_is_number(f) || !json_is_number(e) || flops <= 0 ||
            eff <= 0 || eff > 1) {
            fail(r, "field '%s.%s[%zu]' must be [flops above 0, efficiency in (0, 1]]", where, key, i);
            return;
        }
        if (i > 0 && flops <= c->flops[i - 1]) {
            fail(r, "field '%s.%s[%zu]': flops must ascend (%g after %g)", where, key, i, flops, c->flops[i - 1]);
            return;
        }
        c->flops[i] = flops;
        c->efficiency[i] = eff;
    }
    c->n = (int)n;
}

double dm_size_curve_at(const dm_size_curve *c, double flops) {
    if (flops <= c->flops[0]) return c->efficiency[0];
    for (int i = 1; i < c->n; i++)
        if (flops < c->flops[i]) {
            double t = log(flops / c->flops[i - 1]) / log(c->flops[i] / c->flops[i - 1]);
            return c->efficiency[i - 1] + t * (c->efficiency[i] - c->efficiency[i - 1]);
        }
    return c->efficiency[c->n - 1];
}

static void lone_rank_of(reader *r, json_t *root, dm_hardware *hw) {
    json_t *o = json_object_get(root, "lone_rank");
    if (!o) return;
    if (!json_is_object(o)) {
        fail(r, "field 'lone_rank' must be an object");
        return;
    }
    static const char *const fields[] = {"threads", "matmul_by_size"};
    known_fields(r, o, "lone_rank", fields, 2);
    json_t *threads = json_object_get(o, "threads");
    if (!json_is_integer(threads) || json_integer_value(threads) < 1 || json_integer_value(threads) > 4096)
        fail(r, "field 'lone_rank.threads' must be an integer from 1 to 4096");
    else hw->lone_rank_threads = (int)json_integer_value(threads);
    size_curve(r, o, "lone_rank", "matmul_by_size", &hw->lone_rank_matmul);
    if (!hw->lone_rank_matmul.n) fail(r, "missing field 'lone_rank.matmul_by_size' (an array)");
}

static void link_of(reader *r, json_t *root, const char *key, dm_link *link) {
    json_t *o = object(r, root, "", key);
    if (o) {
        static const char *const fields[] = {"bandwidth", "latency"};
        known_fields(r, o, key, fields, 2);
    }
    link->bandwidth = number(r, o, key, "bandwidth", 0, 1, 0);
    link->latency = number(r, o, key, "latency", 0, 0, 0);
}

/* The description in root (JSON text parsed, or NULL with je saying why); frees root. */
static int parse_root(json_t *root, const json_error_t *je, const char *source, dm_hardware *hw, char *err, size_t errlen) {
    reader r = {.source = source, .err = err, .errlen = errlen};
    memset(hw, 0, sizeof *hw);
    if (!root) {
        fail(&r, "not JSON: %s (line %d, column %d)", je->text, je->line, je->column);
        return -1;
    }
    if (!json_is_object(root)) {
        fail(&r, "a hardware description is a JSON object");
        json_decref(root);
        return -1;
    }
    /* "measured": what `dmc calibrate` measured, kept for the reader; not read here */
    static const char *const top[] = {"name",       "device",          "devices_per_node", "intra_node", "inter_node",
                                      "efficiency", "kernel_overhead", "lone_rank",        "notes",      "measured"};
    known_fields(&r, root, "", top, 10);
    json_t *name = json_object_get(root, "name");
    if (!json_is_string(name) || !*json_string_value(name)) fail(&r, "missing field 'name' (a string)");
    else snprintf(hw->name, sizeof hw->name, "%s", json_string_value(name));
    snprintf(hw->source, sizeof hw->source, "%s", source);

    json_t *device = object(&r, root, "", "device");
    if (device) {
        static const char *const fields[] = {"peak_flops",   "memory_bytes",   "memory_bandwidth",
                                             "vector_flops", "cache_bytes", "cache_bandwidth"};
        known_fields(&r, device, "device", fields, 6);
    }
    json_t *peaks = device ? object(&r, device, "device", "peak_flops") : NULL;
    if (peaks) known_fields(&r, peaks, "device.peak_flops", precision_names, DM_PRECISIONS);
    for (int p = 0; p < DM_PRECISIONS; p++)
        hw->peak_flops[p] = p == DM_FP16 && peaks && !json_object_get(peaks, "fp16")
                                ? hw->peak_flops[DM_BF16]
                                : number(&r, peaks, "device.peak_flops", precision_names[p], 0, 1, 0);
    hw->memory_bytes = number(&r, device, "device", "memory_bytes", 0, 1, 0);
    hw->memory_bandwidth = number(&r, device, "device", "memory_bandwidth", 0, 1, 0);
    if (device && json_object_get(device, "vector_flops"))
        hw->vector_flops = number(&r, device, "device", "vector_flops", 0, 1, 0);
    /* both or neither: a cache without its bandwidth (or the reverse) prices nothing */
    int has_cache_bytes = device && json_object_get(device, "cache_bytes"),
        has_cache_bandwidth = device && json_object_get(device, "cache_bandwidth");
    if (has_cache_bytes != has_cache_bandwidth)
        fail(&r, "field 'device.%s' is given without 'device.%s': give both or neither",
             has_cache_bytes ? "cache_bytes" : "cache_bandwidth", has_cache_bytes ? "cache_bandwidth" : "cache_bytes");
    else if (has_cache_bytes) {
        hw->cache_bytes = number(&r, device, "device", "cache_bytes", 0, 1, 0);
        hw->cache_bandwidth = number(&r, device, "device", "cache_bandwidth", 0, 1, 0);
    }
    if (json_object_get(root, "kernel_overhead")) hw->kernel_overhead = number(&r, root, "", "kernel_overhead", 0, 0, 1);
    lone_rank_of(&r, root, hw);

    json_t *per_node = json_object_get(root, "devices_per_node");
    if (!json_is_integer(per_node) || json_integer_value(per_node) < 1 || json_integer_value(per_node) > (1 << 30)) {
        char *text = per_node ? json_dumps(per_node, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        fail(&r, "field 'devices_per_node' must be an integer from 1, got %s", text ? text : "nothing");
        free(text);
    } else {
        hw->devices_per_node = (int)json_integer_value(per_node);
    }
    link_of(&r, root, "intra_node", &hw->intra_node);
    link_of(&r, root, "inter_node", &hw->inter_node);

    /* optional: 1 (the peaks themselves) where not given */
    hw->matmul_efficiency = hw->memory_efficiency = hw->link_efficiency = 1.0;
    json_t *eff = json_object_get(root, "efficiency");
    if (eff && !json_is_object(eff)) fail(&r, "field 'efficiency' must be an object");
    if (json_is_object(eff)) {
        static const char *const fields[] = {"matmul", "memory", "link", "matmul_by_size", "overlap"};
        known_fields(&r, eff, "efficiency", fields, 5);
        if (json_object_get(eff, "overlap")) hw->overlap = number(&r, eff, "efficiency", "overlap", 0, 0, 1);
        size_curve(&r, eff, "efficiency", "matmul_by_size", &hw->matmul_by_size);
        double *slot[] = {&hw->matmul_efficiency, &hw->memory_efficiency, &hw->link_efficiency};
        for (int k = 0; k < 3; k++)
            if (json_object_get(eff, fields[k])) *slot[k] = number(&r, eff, "efficiency", fields[k], 0, 1, 1);
    }
    json_decref(root);
    return r.failed ? -1 : 0;
}

int dm_hardware_parse(const char *text, const char *source, dm_hardware *hw, char *err, size_t errlen) {
    json_error_t je;
    return parse_root(json_loads(text, 0, &je), &je, source, hw, err, errlen);
}

int dm_hardware_load(const char *name_or_path, dm_hardware *hw, char *err, size_t errlen) {
    const char *const *names, *const *texts;
    int n = dm_hardware_presets(&names, &texts);
    for (int i = 0; i < n; i++)
        if (strcmp(name_or_path, names[i]) == 0) {
            char source[96];
            snprintf(source, sizeof source, "preset %s", names[i]);
            return dm_hardware_parse(texts[i], source, hw, err, errlen);
        }
    FILE *f = fopen(name_or_path, "rb");
    if (f) {
        json_error_t je;
        json_t *root = json_loadf(f, 0, &je);
        fclose(f);
        return parse_root(root, &je, name_or_path, hw, err, errlen);
    }
    snprintf(err, errlen, "%s: %s (not a preset either: %s", name_or_path, strerror(errno), names[0]);
    for (int i = 1; i < n; i++) {
        size_t len = strlen(err);
        snprintf(err + len, errlen - len, "%s%s", i + 1 < n ? ", " : " or ", names[i]);
    }
    size_t len = strlen(err);
    snprintf(err + len, errlen - len, ")");
    return -1;
}

const dm_hardware *dm_hardware_default(void) {
    static dm_hardware nominal;
    static int loaded;
    if (!loaded) {
        char err[256];
        if (dm_hardware_parse(preset_texts[0], "preset nominal", &nominal, err, sizeof err)) abort();
        loaded = 1;
    }
    return &nominal;
}
