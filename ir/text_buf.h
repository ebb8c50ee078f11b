/* text_buf.h: a growing string, for text the compiler assembles piece by piece (the CUDA
 * dialect's kernels, the commands --plan prints). Running out of memory aborts, as the
 * IR's own allocations do.
 *
 * Start from `dm_text t = {0};`; `t.s` is then NULL until the first dm_text_printf, and
 * always NUL-terminated after it, `t.n` characters long. */
#ifndef DM_TEXT_BUF_H
#define DM_TEXT_BUF_H

#include <stddef.h>

typedef struct dm_text {
    char *s;
    size_t n, cap; /* characters written, bytes held */
} dm_text;

/* Appends printf(fmt, ...) to t. */
void dm_text_printf(dm_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees t's characters and leaves it empty, ready for reuse. */
void dm_text_free(dm_text *t);

#endif
