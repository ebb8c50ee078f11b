/* suggest.c: the nearest valid name to a misspelt one (suggest.h). */
#include "suggest.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longer names are not compared: nobody misspells a 64-letter name, and the table stays
 * on the stack. */
enum { MAX_COMPARED = 64 };

static int same_letter(char a, char b) { return tolower((unsigned char)a) == tolower((unsigned char)b); }

/* Optimal string alignment distance (Levenshtein plus swaps of two neighbours), with a
 * letter in the other case counted as the same: --set h=4 means H. */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > MAX_COMPARED || m > MAX_COMPARED) return MAX_COMPARED * 2;
    int d[MAX_COMPARED + 1][MAX_COMPARED + 1];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int cost = !same_letter(a[i - 1], b[j - 1]);
            int best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < best) best = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && same_letter(a[i - 1], b[j - 2]) && same_letter(a[i - 2], b[j - 1]) &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

const char *dm_nearest_name(const char *name, const char *const *valid, int n) {
    /* nothing for one letter (every other letter is one edit away), one edit in a short
     * name, about one in three in a longer one */
    int len = (int)strlen(name), limit = len < 2 ? 0 : len < 5 ? 1 : (len + 1) / 3;
    const char *best = NULL;
    int best_distance = limit + 1;
    for (int i = 0; i < n; i++) {
        int distance = edit_distance(name, valid[i]);
        if (distance < best_distance && strcmp(name, valid[i]) != 0) {
            best = valid[i];
            best_distance = distance;
        }
    }
    return best;
}

void dm_format_suggestion(char *buf, size_t size, const char *near, const char *label, const char *const *valid, int n) {
    if (!size) return;
    buf[0] = 0;
    size_t used = 0;
    if (near) used = (size_t)snprintf(buf, size, "; did you mean '%s'?", near);
    if (n == 0 || used >= size) return;
    used += (size_t)snprintf(buf + used, size - used, " (%s: ", label);
    for (int i = 0; i < n && used < size; i++) {
        const char *sep = i + 1 < n ? ", " : ")";
        /* room for this name, its separator and a closing ", ...)" */
        if (used + strlen(valid[i]) + strlen(sep) + 6 >= size) {
            snprintf(buf + used, size - used, "...)");
            return;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%s", valid[i], sep);
    }
}
