/* diag.h: source files and diagnostics in the `file:line:col: error: message` form,
 * followed by the source line and a caret under the offending range. */
#ifndef DM_DIAG_H
#define DM_DIAG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct dm_source {
    char *path;      /* as given on the command line */
    char *text;      /* whole file, NUL-terminated (may contain other NULs) */
    size_t len;      /* bytes of text, without the terminator */
} dm_source;

/* A position in a source: 1-based line and byte column, and the length of the range
 * the caret underlines (at least 1). */
typedef struct dm_loc {
    int line;
    int col;
    int len;
} dm_loc;

typedef struct dm_diag {
    const dm_source *src;
    FILE *out;
    int n_errors;
    int max_errors;  /* past this, one "too many errors" line and silence (-1: silent from the start) */
    int n_warnings;
    int max_warnings;   /* printed at most; the rest are counted (dm_diag_finish says how many) */
    int quiet_warnings; /* count warnings but print none (the planner's trial compiles) */
    int last_hidden;    /* the last error or warning was not printed: nor are its notes */
} dm_diag;

/* The largest source dmc reads: far above any model file, and within the int length
 * the scanner takes. */
#define DM_MAX_SOURCE_BYTES (64 << 20)

/* Reads path whole, a regular file of at most DM_MAX_SOURCE_BYTES; on failure (or
 * another kind of file, or a larger one) prints `dmc: error: cannot read PATH: reason`
 * and returns -1. */
int dm_source_read(dm_source *src, const char *path, FILE *err);
void dm_source_from_string(dm_source *src, const char *path, const char *text, size_t len);
void dm_source_free(dm_source *src);

void dm_diag_init(dm_diag *d, const dm_source *src, FILE *out);
/* Counts and prints an error at loc. */
void dm_error(dm_diag *d, dm_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dm_verror(dm_diag *d, dm_loc loc, const char *fmt, va_list ap);
/* Prints a warning at loc: the program compiles, but probably not as its author meant.
 * Counted in n_warnings, never in n_errors. */
void dm_warning(dm_diag *d, dm_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The location just past the source's last non-blank character, for what a program
 * lacks (no loss, no optimizer): a caret where the missing statement would go. */
dm_loc dm_source_end(const dm_source *src);
/* After the last diagnostic: one line saying how many warnings past max_warnings were
 * not printed, if any. */
void dm_diag_finish(dm_diag *d);
/* A note attached to the previous error or warning (not counted; not printed when that
 * one was not). */
void dm_note(dm_diag *d, dm_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
