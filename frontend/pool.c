#include "pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pool_chunk {
    struct pool_chunk *next;
    size_t used, size;
    max_align_t data[];
} pool_chunk;

struct dm_pool {
    pool_chunk *chunks;
};

static void *xmalloc(size_t n) {
    void *p = calloc(1, n);
    if (!p) {
        fprintf(stderr, "dmc: error: out of memory\n");
        abort();
    }
    return p;
}

dm_pool *dm_pool_new(void) { return xmalloc(sizeof(dm_pool)); }

void dm_pool_free(dm_pool *pool) {
    if (!pool) return;
    for (pool_chunk *c = pool->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(pool);
}

void *dm_pool_alloc(dm_pool *pool, size_t bytes) {
    size_t align = sizeof(max_align_t);
    bytes = (bytes + align - 1) / align * align;
    pool_chunk *c = pool->chunks;
    if (!c || c->size - c->used < bytes) {
        size_t size = bytes > 65536 ? bytes : 65536;
        c = xmalloc(sizeof(pool_chunk) + size);
        c->size = size;
        c->next = pool->chunks;
        pool->chunks = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += bytes;
    return p;
}

char *dm_pool_strndup(dm_pool *pool, const char *s, size_t n) {
    char *p = dm_pool_alloc(pool, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Capacity is implicit: the next power of two at or above count, so no field is
 * needed beside the count. */
void *dm_pool_push(dm_pool *pool, void *array, int *count, size_t item_size, const void *item) {
    int n = *count;
    if (n == 0 || (n & (n - 1)) == 0) {
        size_t cap = n == 0 ? 4 : (size_t)n * 2;
        void *grown = dm_pool_alloc(pool, cap * item_size);
        if (n) memcpy(grown, array, (size_t)n * item_size);
        array = grown;
    }
    memcpy((char *)array + (size_t)n * item_size, item, item_size);
    *count = n + 1;
    return array;
}
