/* text_buf.c: the growing string of text_buf.h. */
#include "text_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void dm_text_printf(dm_text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int written = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (written < 0) abort();
        if (t->s && t->n + (size_t)written < t->cap) {
            t->n += (size_t)written;
            return;
        }
        /* too short: grow (doubling, so that a text built by many small pieces is copied
         * a logarithmic number of times) and print again */
        size_t cap = t->cap ? t->cap : 256;
        while (cap <= t->n + (size_t)written) cap *= 2;
        char *grown = realloc(t->s, cap);
        if (!grown) abort();
        if (!t->s) grown[0] = 0;
        t->s = grown, t->cap = cap;
    }
}

void dm_text_free(dm_text *t) {
    free(t->s);
    t->s = NULL;
    t->n = t->cap = 0;
}
