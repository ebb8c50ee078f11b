/* text.c: byte-level text for language models: reading a corpus from files, and
 * drawing the next token from a model's logits (see docs/runtime.md, docs/trainer.md).
 *
 * Bytes are tokens 0..255, so the corpus is the files' bytes as they are: no
 * decoding, no normalisation. */
#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends everything readable from fp to t->bytes (grown by doubling); the byte count
 * of this file goes to *got. */
static int append_file(dmrt_text *t, size_t *cap, FILE *fp, const char *path, int64_t *got,
                       char *err, size_t errlen) {
    int64_t start = t->size;
    for (;;) {
        if ((size_t)t->size == *cap) {
            size_t grown = *cap ? 2 * *cap : 65536;
            if (grown < *cap) return dmrt_errorf(err, errlen, "%s: too large to read", path);
            unsigned char *p = realloc(t->bytes, grown);
            if (!p)
                return dmrt_errorf(err, errlen, "%s: out of memory reading %lld bytes", path,
                                   (long long)t->size);
            t->bytes = p;
            *cap = grown;
        }
        size_t r = fread(t->bytes + t->size, 1, *cap - (size_t)t->size, fp);
        t->size += (int64_t)r;
        if (r == 0) break;
    }
    /* A directory opens fine on Linux and fails here (EISDIR). */
    if (ferror(fp)) return dmrt_errorf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
    *got = t->size - start;
    return 0;
}

int dmrt_text_read(dmrt_text *t, int n_files, const char *const *paths, char *err,
                   size_t errlen) {
    memset(t, 0, sizeof *t);
    if (n_files <= 0) return dmrt_errorf(err, errlen, "text corpus: no files given");
    t->file_sizes = calloc((size_t)n_files, sizeof *t->file_sizes);
    if (!t->file_sizes) return dmrt_errorf(err, errlen, "%s: out of memory", paths[0]);
    t->n_files = n_files;
    size_t cap = 0;
    for (int i = 0; i < n_files; i++) {
        FILE *fp = fopen(paths[i], "rb");
        if (!fp) {
            dmrt_errorf(err, errlen, "%s: cannot open: %s", paths[i], strerror(errno));
            goto fail;
        }
        int rc = append_file(t, &cap, fp, paths[i], &t->file_sizes[i], err, errlen);
        fclose(fp);
        if (rc != 0) goto fail;
        /* An empty file in the list is almost certainly a mistake (a wrong path to a
         * freshly created file, a failed download): say so rather than train without it. */
        if (t->file_sizes[i] == 0) {
            dmrt_errorf(err, errlen, "%s: the file is empty; every file of a text corpus needs "
                        "at least one byte", paths[i]);
            goto fail;
        }
    }
    return 0;
fail:
    dmrt_text_free(t);
    return -1;
}

void dmrt_text_free(dmrt_text *t) {
    free(t->bytes);
    free(t->file_sizes);
    memset(t, 0, sizeof *t);
}

/* ---- sampling -------------------------------------------------------------------------------- */

typedef struct ranked_logit {
    float value;
    int index;
} ranked_logit;

/* Largest first; among equal logits the lower index first, so that the top-k set and
 * greedy choices do not depend on qsort's order of equal elements. */
static int by_logit_descending(const void *pa, const void *pb) {
    const ranked_logit *a = pa, *b = pb;
    if (a->value != b->value) return a->value > b->value ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

int dmrt_sample_logits(const float *logits, int n, float temperature, int top_k, dmrt_rng *rng,
                       int *token) {
    if (n <= 0 || top_k < 0 || !(temperature >= 0.0f) || isinf(temperature)) return DMRT_ERR_ARG;
    int best = -1;
    for (int i = 0; i < n; i++) {
        /* NaN or +inf: a model that diverged; there is no distribution to draw from. */
        if (isnan(logits[i]) || logits[i] == INFINITY) return DMRT_ERR_DATA;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    if (logits[best] == -INFINITY) return DMRT_ERR_DATA; /* every token masked out */
    if (temperature == 0.0f || top_k == 1) {
        *token = best; /* greedy: the first maximum, no draw */
        return DMRT_OK;
    }

    int k = top_k == 0 || top_k > n ? n : top_k;
    ranked_logit *ranked = malloc((size_t)n * sizeof *ranked);
    if (!ranked) return DMRT_ERR_NOMEM;
    for (int i = 0; i < n; i++) ranked[i] = (ranked_logit){logits[i], i};
    qsort(ranked, (size_t)n, sizeof *ranked, by_logit_descending);

    /* softmax(logits / temperature) over the k best, in double, shifted by the maximum
     * so that exp never overflows; masked (-inf) logits get probability 0. */
    double max = (double)ranked[0].value, total = 0.0;
    for (int i = 0; i < k; i++) total += exp(((double)ranked[i].value - max) / temperature);
    double u = (double)(dmrt_rng_u64(rng) >> 11) * 0x1.0p-53; /* [0, 1) */
    double target = u * total, cumulative = 0.0;
    int chosen = ranked[0].index; /* has probability 1 / total > 0: a safe fallback */
    for (int i = 0; i < k; i++) {
        double p = exp(((double)ranked[i].value - max) / temperature);
        if (p == 0.0) continue; /* never pick a token of probability 0, even on rounding */
        cumulative += p;
        chosen = ranked[i].index;
        if (cumulative > target) break;
    }
    free(ranked);
    *token = chosen;
    return DMRT_OK;
}
