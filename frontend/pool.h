/* pool.h: a bump allocator for the syntax tree. Everything the parser makes lives in
 * one pool and is freed at once, which keeps error recovery free of leaks. */
#ifndef DM_POOL_H
#define DM_POOL_H

#include <stddef.h>

typedef struct dm_pool dm_pool;

dm_pool *dm_pool_new(void);
void dm_pool_free(dm_pool *pool);
/* Zeroed memory; aborts the process when out of memory. */
void *dm_pool_alloc(dm_pool *pool, size_t bytes);
char *dm_pool_strndup(dm_pool *pool, const char *s, size_t n);
/* Appends item to a pool-allocated array that grows by doubling (count is updated). */
void *dm_pool_push(dm_pool *pool, void *array, int *count, size_t item_size, const void *item);

#endif
