#include "diag.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a path that is no regular file is, for the message refusing it. */
static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

/* Reads the whole of fd, a regular file of `size` bytes when it was looked at: the text
 * and its length, or NULL with errno set (EFBIG when it grew past the limit since). */
static char *read_all(int fd, size_t size, size_t *len) {
    size_t cap = size + 1, n = 0; /* + 1: the terminator */
    char *text = malloc(cap);
    while (text) {
        if (n + 1 == cap) { /* full: the file is larger than it was */
            if (n > DM_MAX_SOURCE_BYTES) break;
            char *grown = realloc(text, cap * 2);
            if (!grown) free(text);
            text = grown, cap *= 2;
            continue;
        }
        ssize_t got = read(fd, text + n, cap - n - 1);
        if (got == 0) break;
        if (got > 0) n += (size_t)got;
        else if (errno != EINTR) {
            int e = errno;
            free(text);
            errno = e;
            return NULL;
        }
    }
    if (!text || n > DM_MAX_SOURCE_BYTES) {
        free(text);
        errno = text ? EFBIG : ENOMEM;
        return NULL;
    }
    text[n] = 0;
    *len = n;
    return text;
}

static int read_failed(FILE *err, const char *path, const char *why, int fd) {
    fprintf(err, "dmc: error: cannot read %s: %s\n", path, why);
    if (fd >= 0) close(fd);
    return -1;
}

/* Only a regular file of at most DM_MAX_SOURCE_BYTES is read: a FIFO would block (it is
 * opened without waiting for a writer, then refused), a device such as /dev/zero would be
 * read until memory ran out, and the scanner takes an int length. */
int dm_source_read(dm_source *src, const char *path, FILE *err) {
    memset(src, 0, sizeof *src);
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return read_failed(err, path, strerror(errno), fd);
    char why[128];
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, sizeof why, "it is %s, not a regular file", file_kind(st.st_mode));
        return read_failed(err, path, why, fd);
    }
    snprintf(why, sizeof why, "it is larger than %d MiB, the most a source file may have", DM_MAX_SOURCE_BYTES >> 20);
    if (st.st_size > (off_t)DM_MAX_SOURCE_BYTES) return read_failed(err, path, why, fd);
    size_t len = 0;
    char *text = read_all(fd, (size_t)st.st_size, &len);
    if (!text) return read_failed(err, path, errno == EFBIG ? why : strerror(errno), fd);
    close(fd);
    src->path = strdup(path);
    src->text = text;
    src->len = len;
    return 0;
}

void dm_source_from_string(dm_source *src, const char *path, const char *text, size_t len) {
    src->path = strdup(path);
    src->text = malloc(len + 1);
    memcpy(src->text, text, len);
    src->text[len] = 0;
    src->len = len;
}

void dm_source_free(dm_source *src) {
    free(src->path);
    free(src->text);
    memset(src, 0, sizeof *src);
}

void dm_diag_init(dm_diag *d, const dm_source *src, FILE *out) {
    d->src = src;
    d->out = out;
    d->n_errors = 0;
    d->max_errors = 20;
    d->n_warnings = 0;
    d->max_warnings = 20;
    d->quiet_warnings = 0;
    d->last_hidden = 0;
}

/* Prints the source line of loc and a caret under it. Long lines are shown as a window
 * around the column so that a 1 MB line prints a readable excerpt. */
static void show_line(const dm_diag *d, dm_loc loc) {
    const dm_source *s = d->src;
    if (!s || loc.line < 1) return;
    const char *p = s->text, *end = s->text + s->len;
    for (int line = 1; line < loc.line && p < end; p++)
        if (*p == '\n') line++;
    const char *eol = p;
    while (eol < end && *eol != '\n') eol++;
    long width = eol - p, col = loc.col - 1;
    if (col > width) col = width;
    long from = 0;
    enum { WINDOW = 100 };
    if (width > WINDOW && col > WINDOW / 2) from = col - WINDOW / 2;
    long to = from + WINDOW < width ? from + WINDOW : width;
    fputs("  ", d->out);
    if (from > 0) fputs("...", d->out);
    for (long i = from; i < to; i++) {
        unsigned char c = (unsigned char)p[i];
        fputc(c == '\t' ? '\t' : (c < 32 || c >= 127) ? '?' : c, d->out);
    }
    if (to < width) fputs("...", d->out);
    fputs("\n  ", d->out);
    if (from > 0) fputs("   ", d->out);
    for (long i = from; i < col; i++) fputc(p[i] == '\t' ? '\t' : ' ', d->out);
    fputc('^', d->out);
    long len = loc.len > 1 ? loc.len : 1;
    for (long i = 1; i < len && col + i < to; i++) fputc('~', d->out);
    fputc('\n', d->out);
}

static void report(dm_diag *d, dm_loc loc, const char *kind, const char *fmt, va_list ap) {
    fprintf(d->out, "%s:%d:%d: %s: ", d->src ? d->src->path : "dmc", loc.line, loc.col, kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    show_line(d, loc);
}

void dm_verror(dm_diag *d, dm_loc loc, const char *fmt, va_list ap) {
    d->n_errors++;
    d->last_hidden = d->n_errors > d->max_errors;
    if (d->last_hidden) {
        if (d->n_errors == d->max_errors + 1)
            fprintf(d->out, "%s: too many errors, stopping\n", d->src ? d->src->path : "dmc");
        return;
    }
    report(d, loc, "error", fmt, ap);
}

void dm_error(dm_diag *d, dm_loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dm_verror(d, loc, fmt, ap);
    va_end(ap);
}

/* Past max_warnings they are counted, not printed: a program can make one per parameter
 * (65536 layer instances of several each), and printing them all took seconds and buried
 * the errors. */
void dm_warning(dm_diag *d, dm_loc loc, const char *fmt, ...) {
    d->n_warnings++;
    d->last_hidden = d->quiet_warnings || d->n_errors > d->max_errors || d->n_warnings > d->max_warnings;
    if (d->last_hidden) return;
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "warning", fmt, ap);
    va_end(ap);
}

dm_loc dm_source_end(const dm_source *src) {
    dm_loc loc = {1, 1, 1};
    if (!src) return loc;
    size_t end = src->len;
    while (end > 0 && (src->text[end - 1] == '\n' || src->text[end - 1] == '\r' || src->text[end - 1] == ' ' ||
                       src->text[end - 1] == '\t'))
        end--;
    for (size_t i = 0; i < end; i++) {
        if (src->text[i] == '\n') {
            loc.line++;
            loc.col = 1;
        } else {
            loc.col++;
        }
    }
    return loc;
}

void dm_diag_finish(dm_diag *d) {
    int hidden = d->n_warnings - d->max_warnings;
    if (hidden <= 0 || d->quiet_warnings || d->n_errors > d->max_errors) return;
    fprintf(d->out, "%s: %d more warning%s not shown (at most %d are printed)\n", d->src ? d->src->path : "dmc", hidden,
            hidden == 1 ? "" : "s", d->max_warnings);
}

void dm_note(dm_diag *d, dm_loc loc, const char *fmt, ...) {
    if (d->last_hidden || d->n_errors > d->max_errors) return;
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "note", fmt, ap);
    va_end(ap);
}
