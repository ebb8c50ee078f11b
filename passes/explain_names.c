/* explain_names.c: lists of names collapsed for --explain, so that a model of many alike
 * layers reads in a screen: the names that differ only in a layer index, and agree in a
 * tag the caller gives (a type, a source line), are printed once with the indices in
 * braces, `h.{0..11}.attn.c_proj.weight`. The layer index is a name's first dot-separated
 * part written as a number. */
#include <stdlib.h>
#include <string.h>

#include "explain.h"

typedef struct name_item {
    char *key;  /* the name with its layer index taken out, then the tag */
    int index;  /* the layer index; -1 where the name has none */
    int pos;    /* the item's place in the caller's list */
    int prefix; /* the length of the name before its index */
    int digits; /* the index's length */
} name_item;

/* The first dot-separated part of name written as a number (no leading zero, short
 * enough for an int): its start and length; 0 where there is none. */
static int layer_index_at(const char *name, int *start) {
    for (const char *p = name; *p;) {
        const char *end = strchr(p, '.');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        size_t digits = strspn(p, "0123456789");
        if (n > 0 && digits == n && n < 9 && !(n > 1 && p[0] == '0')) {
            *start = (int)(p - name);
            return (int)n;
        }
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static char *join_key(const char *name, int prefix, int digits, const char *tag) {
    size_t n = strlen(name), t = strlen(tag);
    char *key = malloc(n + t + 4);
    if (!key) abort();
    /* "h." "\x01" ".attn.c_proj.weight" "\x02" tag: the separators sort before every
     * printable character, so a run of one key is contiguous once sorted */
    memcpy(key, name, (size_t)prefix);
    size_t k = (size_t)prefix;
    key[k++] = digits ? '\x01' : '\x03';
    memcpy(key + k, name + prefix + digits, n - (size_t)prefix - (size_t)digits);
    k += n - (size_t)prefix - (size_t)digits;
    key[k++] = '\x02';
    memcpy(key + k, tag, t);
    key[k + t] = 0;
    return key;
}

static int by_key_index_pos(const void *a, const void *b) {
    const name_item *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c) return c;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int by_first(const void *a, const void *b) {
    const explain_name_group *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* "{0..11}", "{0,2,4}", "{0..3,8..11}": the distinct indices of a sorted run. */
static void append_ranges(const name_item *run, int n, char *buf, size_t size) {
    size_t len = strlen(buf);
    len += (size_t)snprintf(buf + len, size - len, "{");
    for (int i = 0; i < n && len < size;) {
        int j = i;
        while (j + 1 < n && run[j + 1].index <= run[j].index + 1) j++;
        if (run[j].index > run[i].index)
            len += (size_t)snprintf(buf + len, size - len, "%s%d..%d", i ? "," : "", run[i].index, run[j].index);
        else
            len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? "," : "", run[i].index);
        i = j + 1;
    }
    if (len < size) snprintf(buf + len, size - len, "}");
}

/* The printed name of a sorted run of one key: the name itself, or its indices in braces. */
static char *group_name(const char *const *names, const name_item *run, int n) {
    const char *name = names[run[0].pos];
    int distinct = run[n - 1].index > run[0].index;
    if (run[0].index < 0 || !distinct) {
        char *copy = strdup(name);
        if (!copy) abort();
        return copy;
    }
    size_t size = strlen(name) + 16 * (size_t)n + 4;
    char *buf = malloc(size);
    if (!buf) abort();
    memcpy(buf, name, (size_t)run[0].prefix);
    buf[run[0].prefix] = 0;
    append_ranges(run, n, buf, size);
    strncat(buf, name + run[0].prefix + run[0].digits, size - strlen(buf) - 1);
    return buf;
}

int explain_collapse_names(const char *const *names, const char *const *tags, int n, explain_name_group **groups,
                           int *group_of) {
    name_item *items = calloc((size_t)(n > 0 ? n : 1), sizeof *items);
    explain_name_group *out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
    if (!items || !out) abort();
    for (int i = 0; i < n; i++) {
        int start = 0, digits = layer_index_at(names[i], &start);
        items[i].index = digits ? atoi(names[i] + start) : -1;
        items[i].prefix = digits ? start : (int)strlen(names[i]);
        items[i].digits = digits;
        items[i].pos = i;
        items[i].key = join_key(names[i], items[i].prefix, digits, tags ? tags[i] : "");
    }
    qsort(items, (size_t)n, sizeof *items, by_key_index_pos);
    int n_groups = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j < n && strcmp(items[j].key, items[i].key) == 0) j++;
        explain_name_group *grp = &out[n_groups++];
        grp->first = n;
        for (int k = i; k < j; k++)
            if (items[k].pos < grp->first) grp->first = items[k].pos;
        grp->count = j - i;
        grp->name = group_name(names, items + i, j - i);
        i = j;
    }
    qsort(out, (size_t)n_groups, sizeof *out, by_first);
    if (group_of) {
        /* items sharing a key share a group: find each item's by its key's first member */
        int *group_at_first = malloc((size_t)(n > 0 ? n : 1) * sizeof *group_at_first);
        if (!group_at_first) abort();
        for (int k = 0; k < n_groups; k++) group_at_first[out[k].first] = k;
        for (int i = 0; i < n;) {
            int j = i, first = n;
            while (j < n && strcmp(items[j].key, items[i].key) == 0) {
                if (items[j].pos < first) first = items[j].pos;
                j++;
            }
            for (int k = i; k < j; k++) group_of[items[k].pos] = group_at_first[first];
            i = j;
        }
        free(group_at_first);
    }
    for (int i = 0; i < n; i++) free(items[i].key);
    free(items);
    *groups = out;
    return n_groups;
}

void explain_name_groups_free(explain_name_group *groups, int n) {
    for (int i = 0; i < n; i++) free(groups[i].name);
    free(groups);
}
