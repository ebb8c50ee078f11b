/* alloc.c: aligned allocation, dtypes and the small helpers shared by the runtime. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DMRT_ALIGN = 64 };

void *dmrt_alloc(size_t bytes) {
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still gives a
     * unique pointer. */
    size_t rounded = bytes == 0 ? DMRT_ALIGN : (bytes + DMRT_ALIGN - 1) / DMRT_ALIGN * DMRT_ALIGN;
    if (rounded < bytes) return NULL; /* overflow */
    void *p = aligned_alloc(DMRT_ALIGN, rounded);
    if (p) memset(p, 0, rounded);
    return p;
}

void dmrt_free(void *p) { free(p); }

/* A tracked block is one DMRT_ALIGN header (its counted size) and the rounded block. */
void *dmrt_alloc_tracked(dmrt_alloc_stats *stats, size_t bytes) {
    size_t rounded = bytes == 0 ? DMRT_ALIGN : (bytes + DMRT_ALIGN - 1) / DMRT_ALIGN * DMRT_ALIGN;
    if (rounded < bytes || rounded > SIZE_MAX - DMRT_ALIGN) return NULL;
    unsigned char *base = dmrt_alloc(rounded + DMRT_ALIGN);
    if (!base) return NULL;
    memcpy(base, &rounded, sizeof rounded);
    stats->current += rounded;
    if (stats->current > stats->peak) stats->peak = stats->current;
    return base + DMRT_ALIGN;
}

void dmrt_free_tracked(dmrt_alloc_stats *stats, void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - DMRT_ALIGN;
    size_t rounded;
    memcpy(&rounded, base, sizeof rounded);
    stats->current -= rounded;
    free(base);
}

size_t dmrt_dtype_size(dmrt_dtype dtype) {
    switch (dtype) {
    case DMRT_F32: return 4;
    case DMRT_I32: return 4;
    case DMRT_I8: return 1;
    case DMRT_U8: return 1;
    }
    return 0;
}

const char *dmrt_dtype_name(dmrt_dtype dtype) {
    switch (dtype) {
    case DMRT_F32: return "F32";
    case DMRT_I32: return "I32";
    case DMRT_I8: return "I8";
    case DMRT_U8: return "U8";
    }
    return "?";
}

int dmrt_errorf(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

char *dmrt_shape_str(char *buf, size_t buflen, int rank, const int64_t *shape) {
    size_t len = 0;
    if (buflen == 0) return buf;
    buf[0] = '\0';
    for (int i = -1; i <= rank && len < buflen; i++) {
        int w;
        if (i < 0)
            w = snprintf(buf + len, buflen - len, "[");
        else if (i == rank)
            w = snprintf(buf + len, buflen - len, "]");
        else
            w = snprintf(buf + len, buflen - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0) break;
        len += (size_t)w;
    }
    return buf;
}

int64_t dmrt_shape_numel(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}
