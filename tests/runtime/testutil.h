/* testutil.h: files and processes for the runtime tests. */
#ifndef DMRT_TESTUTIL_H
#define DMRT_TESTUTIL_H

#include <stddef.h>

/* A fresh directory under $TMPDIR (or /tmp); writes its path into buf. 0 on success. */
int tu_mkdtemp(char *buf, size_t len);
/* Removes the files of a flat directory, then the directory. */
void tu_rmdir(const char *dir);
/* "dir/name" into buf; returns buf. */
char *tu_path(char *buf, size_t len, const char *dir, const char *name);
/* Whole file, malloc'd (NUL-terminated for convenience); NULL on failure. */
char *tu_read(const char *path, size_t *size);
int tu_write(const char *path, const void *data, size_t size);
int tu_exists(const char *path);
/* Entries of dir whose name contains ".tmp.". */
int tu_count_tmp(const char *dir);
/* Runs argv[0] with argv, stdout and stderr into the given files; exit status, or -1. */
int tu_run(char *const *argv, const char *out_path, const char *err_path);

/* What a run printed. out and err are never NULL (empty when unreadable). */
typedef struct tu_output {
    int status;         /* exit status, or -1 */
    char *out, *err;    /* malloc'd, NUL-terminated */
    size_t out_size;    /* bytes of out (it may hold NULs) */
} tu_output;
/* tu_run with stdout and stderr into DIR/stdout.txt and DIR/stderr.txt, read back. */
tu_output tu_run_capture(char *const *argv, const char *dir);
void tu_output_free(tu_output *o);

#endif
