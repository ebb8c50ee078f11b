/* safetensors.c: reading (whole file, validated) and atomic writing of safetensors.
 *
 * Layout: u64 little-endian N, N bytes of JSON header, then the data area. The
 * header maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data area) plus an optional "__metadata__" object. */
#define _XOPEN_SOURCE 700 /* realpath (with the build's _POSIX_C_SOURCE 200809L) */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The Python implementation refuses headers above 100 MB; so do we. */
#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

typedef struct {
    int64_t begin, end;
} st_range;

static int st_dtype_parse(const char *s, dmrt_dtype *dtype) {
    if (strcmp(s, "F32") == 0) return *dtype = DMRT_F32, 0;
    if (strcmp(s, "I32") == 0) return *dtype = DMRT_I32, 0;
    if (strcmp(s, "I8") == 0) return *dtype = DMRT_I8, 0;
    if (strcmp(s, "U8") == 0) return *dtype = DMRT_U8, 0;
    return -1;
}

/* What a file that is not a regular one is, for the messages refusing it. */
static const char *special_kind(mode_t mode) {
    return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : "a device or socket";
}

/* Only regular files are read: a FIFO's open would wait for a writer, a device's read
 * never end; checked before the open (fstat after it checks what was opened). */
static int refuse_special(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return dmrt_errorf(err, errlen, "%s: not a regular file (%s)", path, special_kind(st.st_mode));
    return 0;
}

/* The file's bytes, mapped read-only (*mapped set: munmap at close) rather than copied: the
 * ranks of one machine that read the same weights or checkpoint (threads of one process,
 * or processes) share its pages in the page cache, and each touches only the tensors, or
 * blocks of them, it copies; a file copied into every rank's own memory was that many
 * copies at once (8 ranks loading GPT-2 124M: 4 GB). A file the system cannot map (or an
 * empty one) is read into memory instead. The file must not shrink while it is open (a
 * page past its new end would fault): dmc replaces its files by rename, never in place. */
static int read_whole(const char *path, void **buf, size_t *size, size_t *mapped, char *err, size_t errlen) {
    *mapped = 0;
    if (refuse_special(path, err, errlen) != 0) return -1;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dmrt_errorf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return dmrt_errorf(err, errlen, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    if (n > 0) {
        void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fileno(fp), 0);
        if (p != MAP_FAILED) {
            fclose(fp);
            *buf = p;
            *size = *mapped = n;
            return 0;
        }
    }
    char *p = malloc(n ? n : 1);
    if (!p) {
        fclose(fp);
        return dmrt_errorf(err, errlen, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = fread(p, 1, n, fp);
    int rerr = ferror(fp);
    fclose(fp);
    if (got != n) {
        free(p);
        return dmrt_errorf(err, errlen, "%s: read %zu of %zu bytes%s%s", path, got, n,
                           rerr ? ": " : "", rerr ? strerror(errno) : " (file shrank?)");
    }
    *buf = p;
    *size = n;
    return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t json_nonneg(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x;
}

static int cmp_by_offset(const void *pa, const void *pb) {
    const dmrt_st_tensor *a = pa, *b = pb;
    /* data already points into one buffer: pointer order is offset order. */
    const char *da = a->data, *db = b->data;
    if (da != db) return da < db ? -1 : 1;
    if (a->numel != b->numel) return a->numel < b->numel ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Parses one tensor entry; on error, a message naming the tensor (the caller adds
 * the path). */
static int parse_entry(const char *name, json_t *v, uint64_t data_size, dmrt_st_tensor *t,
                       st_range *r, char *msg, size_t msglen) {
    char sbuf[256];
    if (!json_is_object(v))
        return dmrt_errorf(msg, msglen, "tensor '%s': entry is not a JSON object", name);
    json_t *jd = json_object_get(v, "dtype");
    json_t *js = json_object_get(v, "shape");
    json_t *jo = json_object_get(v, "data_offsets");
    if (!jd) return dmrt_errorf(msg, msglen, "tensor '%s': missing \"dtype\"", name);
    if (!js) return dmrt_errorf(msg, msglen, "tensor '%s': missing \"shape\"", name);
    if (!jo) return dmrt_errorf(msg, msglen, "tensor '%s': missing \"data_offsets\"", name);
    if (!json_is_string(jd))
        return dmrt_errorf(msg, msglen, "tensor '%s': \"dtype\" is not a string", name);
    if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return dmrt_errorf(msg, msglen, "tensor '%s': unsupported dtype '%s' (supported: F32, I32, I8, U8)",
                           name, json_string_value(jd));
    if (!json_is_array(js))
        return dmrt_errorf(msg, msglen, "tensor '%s': \"shape\" is not an array", name);
    size_t rank = json_array_size(js);
    if (rank > DMRT_MAX_RANK)
        return dmrt_errorf(msg, msglen, "tensor '%s': shape has rank %zu, more than %d", name,
                           rank, DMRT_MAX_RANK);
    t->rank = (int)rank;
    for (size_t i = 0; i < rank; i++) {
        int64_t d = json_nonneg(json_array_get(js, i));
        if (d < 0)
            return dmrt_errorf(msg, msglen,
                               "tensor '%s': shape entry %zu is not a non-negative integer", name,
                               i);
        t->shape[i] = d;
    }
    t->numel = dmrt_shape_numel(t->rank, t->shape);
    if (t->numel < 0 || t->numel > INT64_MAX / 8)
        return dmrt_errorf(msg, msglen, "tensor '%s': shape %s is too large", name,
                           dmrt_shape_str(sbuf, sizeof sbuf, t->rank, t->shape));
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        json_nonneg(json_array_get(jo, 0)) < 0 || json_nonneg(json_array_get(jo, 1)) < 0)
        return dmrt_errorf(msg, msglen,
                           "tensor '%s': \"data_offsets\" is not [begin, end] with non-negative "
                           "integers",
                           name);
    r->begin = json_nonneg(json_array_get(jo, 0));
    r->end = json_nonneg(json_array_get(jo, 1));
    if (r->begin > r->end)
        return dmrt_errorf(msg, msglen, "tensor '%s': data_offsets [%lld, %lld] end before they begin",
                           name, (long long)r->begin, (long long)r->end);
    if ((uint64_t)r->end > data_size)
        return dmrt_errorf(msg, msglen,
                           "tensor '%s': data_offsets [%lld, %lld] are out of range: the data "
                           "area has %llu bytes",
                           name, (long long)r->begin, (long long)r->end,
                           (unsigned long long)data_size);
    int64_t need = t->numel * (int64_t)dmrt_dtype_size(t->dtype);
    if (r->end - r->begin != need)
        return dmrt_errorf(msg, msglen,
                           "tensor '%s': data_offsets [%lld, %lld] hold %lld bytes but shape %s "
                           "of %s needs %lld",
                           name, (long long)r->begin, (long long)r->end,
                           (long long)(r->end - r->begin),
                           dmrt_shape_str(sbuf, sizeof sbuf, t->rank, t->shape),
                           dmrt_dtype_name(t->dtype), (long long)need);
    return 0;
}

/* Everything after the file is in memory; path-less messages in msg. */
/* The string pairs of a "__metadata__" object into f (the format allows only strings; others
 * are skipped, as readers of the format do). */
static int keep_metadata(dmrt_st_file *f, json_t *meta, char *msg, size_t msglen) {
    size_t cap = json_object_size(meta);
    f->meta_keys = calloc(cap ? cap : 1, sizeof *f->meta_keys);
    f->meta_values = calloc(cap ? cap : 1, sizeof *f->meta_values);
    if (!f->meta_keys || !f->meta_values) return dmrt_errorf(msg, msglen, "out of memory");
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val) {
        if (!json_is_string(val)) continue;
        f->meta_keys[f->n_meta] = strdup(key);
        f->meta_values[f->n_meta] = strdup(json_string_value(val));
        if (!f->meta_keys[f->n_meta] || !f->meta_values[f->n_meta]) {
            f->n_meta++; /* freed with the rest */
            return dmrt_errorf(msg, msglen, "out of memory");
        }
        f->n_meta++;
    }
    return 0;
}

/* The tensors, in file order, must cover the data area exactly, as the format's reference
 * reader requires (its MetadataIncompleteBuffer): no overlap, no gap, no trailing bytes,
 * so that a file with another appended, or cut and padded, is not read as if whole. Empty
 * tensors cover nothing and are not placed. */
static int check_coverage(dmrt_st_file *f, const char *data, uint64_t data_size, char *msg, size_t msglen) {
    if (f->n_tensors > 1) qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_by_offset);
    const dmrt_st_tensor *prev = NULL;
    int64_t covered = 0; /* the end of the bytes the tensors before cover */
    for (int i = 0; i < f->n_tensors; i++) {
        const dmrt_st_tensor *t = &f->tensors[i];
        if (t->numel == 0) continue;
        int64_t tb = (const char *)t->data - data, te = tb + t->numel * (int64_t)dmrt_dtype_size(t->dtype);
        if (prev && tb < covered)
            return dmrt_errorf(msg, msglen, "tensors '%s' and '%s' overlap: data_offsets [%lld, %lld] and [%lld, %lld]",
                               prev->name, t->name, (long long)((const char *)prev->data - data), (long long)covered,
                               (long long)tb, (long long)te);
        if (tb > covered)
            return dmrt_errorf(msg, msglen, "a gap of %lld bytes before tensor '%s' (data_offsets [%lld, %lld]): the "
                               "tensors must cover the data area without gaps", (long long)(tb - covered), t->name,
                               (long long)tb, (long long)te);
        prev = t, covered = te;
    }
    if ((uint64_t)covered != data_size)
        return dmrt_errorf(msg, msglen, "%llu bytes after the last tensor: the tensors cover %lld of the data area's "
                           "%llu bytes (another file appended, or not a safetensors file)",
                           (unsigned long long)(data_size - (uint64_t)covered), (long long)covered,
                           (unsigned long long)data_size);
    return 0;
}

/* meta_only: f->buffer holds the length and the header only (dmrt_st_read_meta), whose
 * "__metadata__" is kept and tensors skipped. */
static int parse_file(dmrt_st_file *f, int meta_only, char *msg, size_t msglen) {
    const unsigned char *b = f->buffer;
    if (f->size < 8)
        return dmrt_errorf(msg, msglen,
                           "file is %zu bytes, too short for the 8-byte header length", f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen > f->size - 8)
        return dmrt_errorf(msg, msglen,
                           "header length %llu is beyond the end of the file (%zu bytes follow "
                           "the length); truncated or not a safetensors file",
                           (unsigned long long)hlen, f->size - 8);
    if (hlen > ST_MAX_HEADER)
        return dmrt_errorf(msg, msglen, "header length %llu is larger than the %llu allowed",
                           (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return dmrt_errorf(msg, msglen, "header is not valid JSON: %s (line %d, column %d)",
                           jerr.text, jerr.line, jerr.column);
    if (!json_is_object(root)) {
        json_decref(root);
        return dmrt_errorf(msg, msglen, "header is not a JSON object");
    }
    uint64_t data_size = f->size - 8 - hlen;
    const char *data = (const char *)b + 8 + hlen;
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    st_range *ranges = calloc(cap ? cap : 1, sizeof *ranges);
    if (!f->tensors || !ranges) {
        free(ranges);
        json_decref(root);
        return dmrt_errorf(msg, msglen, "out of memory");
    }
    int rc = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = dmrt_errorf(msg, msglen, "\"__metadata__\" is not a JSON object");
                break;
            }
            if ((rc = keep_metadata(f, val, msg, msglen)) != 0) break;
            continue;
        }
        if (meta_only) continue;
        dmrt_st_tensor *t = &f->tensors[f->n_tensors];
        st_range *r = &ranges[f->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            rc = dmrt_errorf(msg, msglen, "out of memory");
            break;
        }
        f->n_tensors++;
        if ((rc = parse_entry(key, val, data_size, t, r, msg, msglen)) != 0) break;
        t->data = data + r->begin;
    }
    json_decref(root);
    if (rc == 0 && !meta_only) rc = check_coverage(f, data, data_size, msg, msglen);
    free(ranges);
    return rc;
}

int dmrt_st_read(dmrt_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (read_whole(path, &f->buffer, &f->size, &f->mapped, err, errlen) != 0) return -1;
    f->path = strdup(path);
    char msg[1024];
    msg[0] = '\0';
    if (!f->path || parse_file(f, 0, msg, sizeof msg) != 0) {
        dmrt_st_close(f);
        return dmrt_errorf(err, errlen, "%s: %s", path, msg[0] ? msg : "out of memory");
    }
    return 0;
}

int dmrt_st_read_meta(dmrt_st_file *f, const char *path, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (refuse_special(path, err, errlen) != 0) return -1;
    FILE *fp = fopen(path, "rb");
    if (!fp) return dmrt_errorf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    unsigned char len[8];
    uint64_t hlen = 0;
    size_t got = fread(len, 1, 8, fp);
    for (int i = 7; got == 8 && i >= 0; i--) hlen = hlen << 8 | len[i];
    char msg[1024];
    msg[0] = '\0';
    int rc = 0;
    if (got != 8) rc = dmrt_errorf(msg, sizeof msg, "file is %zu bytes, too short for the 8-byte header length", got);
    else if (hlen > ST_MAX_HEADER)
        rc = dmrt_errorf(msg, sizeof msg, "header length %llu is larger than the %llu allowed", (unsigned long long)hlen,
                         (unsigned long long)ST_MAX_HEADER);
    else if (!(f->buffer = malloc((size_t)hlen + 8))) rc = dmrt_errorf(msg, sizeof msg, "out of memory");
    else {
        memcpy(f->buffer, len, 8);
        f->size = 8 + fread((char *)f->buffer + 8, 1, (size_t)hlen, fp);
    }
    fclose(fp);
    if (rc == 0 && !(f->path = strdup(path))) rc = -1;
    if (rc == 0) rc = parse_file(f, 1, msg, sizeof msg);
    if (rc != 0) {
        dmrt_st_close(f);
        return dmrt_errorf(err, errlen, "%s: %s", path, msg[0] ? msg : "out of memory");
    }
    return 0;
}

void dmrt_st_close(dmrt_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    if (f->mapped) munmap(f->buffer, f->mapped);
    else free(f->buffer);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const dmrt_st_tensor *dmrt_st_find(const dmrt_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *dmrt_st_meta(const dmrt_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ---- writing ---------------------------------------------------------------------------- */

/* The JSON header, padded with spaces to a multiple of 8; malloc'd. */
static char *build_header(const char *path, int n, const dmrt_tensor_desc *descs, int n_meta,
                          const char *const *keys, const char *const *values, size_t *hlen, char *err,
                          size_t errlen) {
    json_t *root = json_object();
    if (!root) return dmrt_errorf(err, errlen, "%s: out of memory", path), NULL;
    if (n_meta > 0) {
        json_t *meta = json_object();
        for (int i = 0; meta && i < n_meta; i++)
            if (json_object_set_new(meta, keys[i], json_string(values[i])) != 0) {
                json_decref(meta);
                json_decref(root);
                return dmrt_errorf(err, errlen, "%s: metadata '%s': cannot encode it (not UTF-8?)", path, keys[i]), NULL;
            }
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) {
            json_decref(root);
            return dmrt_errorf(err, errlen, "%s: out of memory", path), NULL;
        }
    }
    int64_t off = 0;
    char sbuf[256];
    for (int i = 0; i < n; i++) {
        const dmrt_tensor_desc *d = &descs[i];
        const char *fail = NULL;
        if (!d->name || !d->name[0]) fail = "has no name";
        else if (d->dtype != DMRT_F32 && d->dtype != DMRT_I32 && d->dtype != DMRT_I8 && d->dtype != DMRT_U8) fail = "has an unknown dtype";
        else if (d->rank < 0 || d->rank > DMRT_MAX_RANK) fail = "has a bad rank";
        else if (dmrt_shape_numel(d->rank, d->shape) != d->numel)
            fail = "has numel that does not match its shape";
        else if (strcmp(d->name, "__metadata__") == 0) fail = "uses the reserved name";
        else if (json_object_get(root, d->name)) fail = "appears twice";
        if (fail) {
            int rank = d->rank < 0 ? 0 : d->rank > DMRT_MAX_RANK ? DMRT_MAX_RANK : d->rank;
            json_decref(root);
            dmrt_errorf(err, errlen, "%s: tensor %d ('%s', shape %s) %s", path, i,
                        d->name ? d->name : "", dmrt_shape_str(sbuf, sizeof sbuf, rank, d->shape),
                        fail);
            return NULL;
        }
        int64_t bytes = d->numel * (int64_t)dmrt_dtype_size(d->dtype);
        json_t *shape = json_array();
        for (int k = 0; k < d->rank; k++) json_array_append_new(shape, json_integer(d->shape[k]));
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer(off));
        json_array_append_new(offs, json_integer(off + bytes));
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(dmrt_dtype_name(d->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        if (json_object_set_new(root, d->name, e) != 0) {
            json_decref(root);
            dmrt_errorf(err, errlen, "%s: tensor '%s': cannot encode the name (not UTF-8?)",
                        path, d->name);
            return NULL;
        }
        off += bytes;
    }
    char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!js) return dmrt_errorf(err, errlen, "%s: cannot encode the header", path), NULL;
    size_t len = strlen(js), padded = (len + 7) / 8 * 8;
    char *h = malloc(padded + 1);
    if (!h) {
        free(js);
        return dmrt_errorf(err, errlen, "%s: out of memory", path), NULL;
    }
    memcpy(h, js, len);
    memset(h + len, ' ', padded - len);
    h[padded] = '\0';
    free(js);
    *hlen = padded;
    return h;
}

/* fsync of the directory holding path, so that the rename itself is durable. Best
 * effort: some file systems refuse fsync on directories. */
static void sync_parent_dir(const char *path) {
    char dir[4096];
    if (dmrt_parent_dir(path, dir, sizeof dir) != 0) return;
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* The process's umask (Linux's /proc/self/status says it without changing it, which
 * umask() cannot do: another thread creating a file in between would get the wrong one);
 * 022 where it cannot be read. */
static mode_t current_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    unsigned mask = 022;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1) break;
    if (f) fclose(f);
    return (mode_t)(mask & 0777);
}

const char *dmrt_atomic_target(const char *path, char *buf, size_t len, char *err, size_t errlen) {
    struct stat st;
    if (lstat(path, &st) != 0 || S_ISREG(st.st_mode)) return path; /* new, or a file: itself */
    if (S_ISLNK(st.st_mode)) {
        /* write through the link, as a plain write would: the rename replaces its target */
        char *real = realpath(path, NULL);
        if (real && stat(real, &st) == 0 && S_ISREG(st.st_mode) && strlen(real) < len) {
            memcpy(buf, real, strlen(real) + 1);
            free(real);
            return buf;
        }
        free(real);
        if (stat(path, &st) != 0) return path; /* a dangling link: replaced by the file */
    }
    /* a rename over it would replace it (as root, /dev/null itself) */
    dmrt_errorf(err, errlen, "not a regular file (%s): give a file's path", special_kind(st.st_mode));
    return NULL;
}

FILE *dmrt_temporary_beside(const char *path, char *tmp, size_t len) {
    int k = snprintf(tmp, len, "%s.tmp.XXXXXX", path);
    if (k < 0 || (size_t)k >= len) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) return NULL;
    (void)fchmod(fd, 0666 & ~current_umask()); /* mkstemp's 0600 is not what fopen would give */
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        remove(tmp);
        errno = e;
    }
    return f;
}

int dmrt_parent_dir(const char *path, char *dir, size_t len) {
    const char *slash = strrchr(path, '/');
    int k = !slash ? snprintf(dir, len, ".") : snprintf(dir, len, "%.*s", (int)(slash == path ? 1 : slash - path), path);
    return k < 0 || (size_t)k >= len ? -1 : 0;
}

int dmrt_st_write(const char *path, int n, const dmrt_tensor_desc *descs,
                  const void *const *data, char *err, size_t errlen) {
    return dmrt_st_write_meta(path, n, descs, data, 0, NULL, NULL, err, errlen);
}

int dmrt_st_write_meta(const char *path, int n, const dmrt_tensor_desc *descs, const void *const *data, int n_meta,
                       const char *const *keys, const char *const *values, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if (!data[i] && descs[i].numel > 0)
            return dmrt_errorf(err, errlen, "%s: tensor '%s' has no data", path,
                               descs[i].name ? descs[i].name : "");
    char target[4096], why[256];
    const char *given = path;
    path = dmrt_atomic_target(given, target, sizeof target, why, sizeof why);
    if (!path) return dmrt_errorf(err, errlen, "%s: %s", given, why);
    size_t hlen = 0;
    char *header = build_header(given, n, descs, n_meta, keys, values, &hlen, err, errlen);
    if (!header) return -1;

    size_t tlen = strlen(path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) {
        free(header);
        return dmrt_errorf(err, errlen, "%s: out of memory", path);
    }
    /* a name of its own beside path (two runs, even of one pid in two containers, never
     * share one) */
    FILE *fp = dmrt_temporary_beside(path, tmp, tlen);
    if (!fp) {
        int e = errno;
        free(header);
        dmrt_errorf(err, errlen, "%s: cannot create temporary file %s: %s", path, tmp,
                    strerror(e));
        free(tmp);
        return -1;
    }
    const char *what = NULL;
    int e = 0;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (fwrite(len8, 1, 8, fp) != 8 || fwrite(header, 1, hlen, fp) != hlen) what = "write";
    for (int i = 0; i < n && !what; i++) {
        size_t bytes = (size_t)descs[i].numel * dmrt_dtype_size(descs[i].dtype);
        if (bytes && fwrite(data[i], 1, bytes, fp) != bytes) what = "write";
    }
    if (!what && fflush(fp) != 0) what = "write";
    if (!what && fsync(fileno(fp)) != 0) what = "fsync";
    if (what) e = errno;
    if (fclose(fp) != 0 && !what) what = "close", e = errno;
    if (!what && rename(tmp, path) != 0) what = "rename to the final name", e = errno;
    free(header);
    if (what) {
        remove(tmp);
        dmrt_errorf(err, errlen, "%s: %s of temporary file %s failed: %s (file left unchanged)",
                    path, what, tmp, strerror(e));
        free(tmp);
        return -1;
    }
    free(tmp);
    sync_parent_dir(path);
    return 0;
}
