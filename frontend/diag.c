#include "diag.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int dm_source_read(dm_source *src, const char *path, FILE *err) {
    memset(src, 0, sizeof *src);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(err, "dmc: error: cannot read %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 65536, len = 0;
    char *text = malloc(cap);
    for (;;) {
        if (!text) break;
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
        if (cap - len - 1 == 0) {
            char *grown = realloc(text, cap * 2);
            if (!grown) { free(text); text = NULL; break; }
            text = grown;
            cap *= 2;
        }
    }
    int failed = ferror(f) || !text;
    fclose(f);
    if (failed) {
        fprintf(err, "dmc: error: cannot read %s: %s\n", path, text ? "read error" : "out of memory");
        free(text);
        return -1;
    }
    text[len] = 0;
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
    d->quiet_warnings = 0;
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
    if (d->n_errors > d->max_errors) {
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

void dm_warning(dm_diag *d, dm_loc loc, const char *fmt, ...) {
    d->n_warnings++;
    if (d->quiet_warnings || d->n_errors > d->max_errors) return;
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

void dm_note(dm_diag *d, dm_loc loc, const char *fmt, ...) {
    if (d->n_errors > d->max_errors) return;
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "note", fmt, ap);
    va_end(ap);
}
