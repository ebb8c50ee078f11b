/* idx.c: IDX files (MNIST, Fashion-MNIST), plain or gzip-compressed.
 *
 * Big-endian: magic 0x00000803 (u8 images: n, rows, cols) or 0x00000801 (u8 labels: n),
 * then the dims as u32, then the bytes. zlib's gzread reads plain files as they are. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_IMAGES 0x00000803u
#define IDX_LABELS 0x00000801u
/* Refuse absurd dims before allocating (4 GiB of u8). */
#define IDX_MAX_BYTES ((int64_t)1 << 32)

/* Reads exactly n bytes; returns how many were read, or -1 on a zlib error. */
static int64_t gz_read_full(gzFile gz, void *buf, int64_t n) {
    int64_t got = 0;
    while (got < n) {
        int64_t chunk = n - got > (1 << 30) ? (1 << 30) : n - got;
        int r = gzread(gz, (char *)buf + got, (unsigned)chunk);
        if (r < 0) return -1;
        if (r == 0) break;
        got += r;
    }
    return got;
}

static int gz_fail(gzFile gz, const char *path, const char *what, char *err, size_t errlen) {
    int code = 0;
    const char *m = gzerror(gz, &code);
    if (code == Z_BUF_ERROR)
        return dmrt_errorf(err, errlen, "%s: truncated: the gzip stream ends early (in %s)", path,
                           what);
    /* zlib's message starts with the path, which ours names already */
    size_t n = strlen(path);
    if (m && strncmp(m, path, n) == 0 && strncmp(m + n, ": ", 2) == 0) m += n + 2;
    /* a corrupt stream shows where zlib first checks it (with its read-ahead, the first read
     * of a small file), not where the damage is: say only that it is corrupt */
    if (code == Z_DATA_ERROR) return dmrt_errorf(err, errlen, "%s: corrupt gzip data: %s", path, m);
    return dmrt_errorf(err, errlen, "%s: error reading %s: %s", path, what,
                       code == Z_ERRNO ? strerror(errno) : m);
}

/* The header: the magic number (images or labels) and the dims, checked. dims[0] is the
 * count of examples, dims[1] x dims[2] each one's bytes (1 x 1 for labels). Returns 0 or
 * -1 with err set. */
static int read_header(gzFile gz, const char *path, int *ndims, int64_t dims[3], char *err, size_t errlen) {
    unsigned char hdr[16];
    int64_t got = gz_read_full(gz, hdr, 4);
    if (got < 0) return gz_fail(gz, path, "the magic number", err, errlen);
    if (got < 4)
        return dmrt_errorf(err, errlen, "%s: truncated: %lld bytes, too short for an IDX magic number", path,
                           (long long)got);
    uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (magic == IDX_IMAGES) *ndims = 3;
    else if (magic == IDX_LABELS) *ndims = 1;
    else
        return dmrt_errorf(err, errlen,
                           "%s: bad magic number 0x%08x (expected 0x00000803 for u8 images or "
                           "0x00000801 for u8 labels)",
                           path, magic);
    got = gz_read_full(gz, hdr + 4, 4 * *ndims);
    if (got < 0) return gz_fail(gz, path, "the dimensions", err, errlen);
    if (got < 4 * *ndims)
        return dmrt_errorf(err, errlen, "%s: truncated in the header: %d dimensions need %d bytes, got %lld", path,
                           *ndims, 4 * *ndims, (long long)got);
    dims[0] = 0, dims[1] = dims[2] = 1;
    for (int i = 0; i < *ndims; i++) {
        const unsigned char *p = hdr + 4 + 4 * i;
        dims[i] = (int64_t)((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]);
    }
    if (*ndims == 3 && (dims[1] == 0 || dims[2] == 0))
        return dmrt_errorf(err, errlen, "%s: images of %lld x %lld pixels", path, (long long)dims[1],
                           (long long)dims[2]);
    /* (in double: dims each below 2^32 multiply past int64_t; an example's bytes are checked
     * alone too, as there may be no examples) */
    double example = (double)dims[1] * (double)dims[2];
    if (example > (double)IDX_MAX_BYTES || (double)dims[0] * example > (double)IDX_MAX_BYTES)
        return dmrt_errorf(err, errlen, "%s: %lld examples of %lld x %lld bytes is more than this reader allows", path,
                           (long long)dims[0], (long long)dims[1], (long long)dims[2]);
    return 0;
}

/* The total bytes of data after the header, and nothing after them. Returns 0 or -1 with
 * err set. */
static int read_data(gzFile gz, const char *path, unsigned char *raw, int64_t total, int64_t examples, char *err,
                     size_t errlen) {
    int64_t got = gz_read_full(gz, raw, total);
    if (got < 0) return gz_fail(gz, path, "the data", err, errlen);
    if (got < total)
        return dmrt_errorf(err, errlen,
                           "%s: truncated: header says %lld examples (%lld bytes of data) but only %lld "
                           "bytes follow",
                           path, (long long)examples, (long long)total, (long long)got);
    unsigned char extra;
    got = gz_read_full(gz, &extra, 1);
    if (got < 0) return gz_fail(gz, path, "past the data", err, errlen);
    if (got > 0)
        return dmrt_errorf(err, errlen, "%s: trailing bytes after the %lld examples the header declares", path,
                           (long long)examples);
    return 0;
}

int dmrt_idx_read(dmrt_idx *out, const char *path, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return dmrt_errorf(err, errlen, "%s: cannot open: %s", path,
                           errno ? strerror(errno) : "out of memory");
    gzbuffer(gz, 1 << 20); /* fewer, larger reads; data sets are tens of MB */
    int rc = -1, ndims = 0;
    unsigned char *raw = NULL;
    int64_t dims[3];
    if (read_header(gz, path, &ndims, dims, err, errlen) != 0) goto done;
    int64_t row = dims[1] * dims[2], total = dims[0] * row;
    raw = malloc(total ? (size_t)total : 1);
    if (!raw) {
        dmrt_errorf(err, errlen, "%s: out of memory for %lld bytes", path, (long long)total);
        goto done;
    }
    if (read_data(gz, path, raw, total, dims[0], err, errlen) != 0) goto done;
    out->n = dims[0];
    out->row_size = row;
    if (ndims == 3) {
        out->images = dmrt_alloc((size_t)total * sizeof(float));
        if (!out->images) {
            dmrt_errorf(err, errlen, "%s: out of memory", path);
            goto done;
        }
        for (int64_t i = 0; i < total; i++) out->images[i] = (float)raw[i] / 255.0f;
    } else {
        out->labels = dmrt_alloc((size_t)total * sizeof(int32_t));
        if (!out->labels) {
            dmrt_errorf(err, errlen, "%s: out of memory", path);
            goto done;
        }
        for (int64_t i = 0; i < total; i++) out->labels[i] = raw[i];
    }
    rc = 0;
done:
    free(raw);
    gzclose(gz);
    if (rc != 0) dmrt_idx_free(out);
    return rc;
}

void dmrt_idx_free(dmrt_idx *idx) {
    if (!idx) return;
    dmrt_free(idx->images);
    dmrt_free(idx->labels);
    memset(idx, 0, sizeof *idx);
}
