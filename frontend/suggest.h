/* suggest.h: "did you mean" for unknown names (functions, optimizer settings, dims,
 * command-line options): the nearest valid name by edit distance, and the valid ones. */
#ifndef DM_SUGGEST_H
#define DM_SUGGEST_H

#include <stddef.h>

/* The name in valid[0..n) nearest to name (optimal string alignment distance: typos,
 * a letter too many or too few, two swapped, another case), or NULL when none is close
 * enough to be what was meant (more than about a third of the letters differ). */
const char *dm_nearest_name(const char *name, const char *const *valid, int n);

/* Writes "; did you mean 'NEAR'? (LABEL: a, b, c)" into buf: the first part only when
 * near is not NULL, the second only when n > 0 (cut short with "...)" when it does not
 * fit); "" when neither. */
void dm_format_suggestion(char *buf, size_t size, const char *near, const char *label, const char *const *valid, int n);

#endif
