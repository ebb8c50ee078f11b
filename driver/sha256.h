/* sha256.h: SHA-256 (FIPS 180-4), the key of dmc run's cache of built programs
 * (build_cache.h): a digest of everything that went into a build, so that two builds with
 * the same key are the same program. Incremental: init, update with pieces, final. */
#ifndef DMC_SHA256_H
#define DMC_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t state[8];  /* the hash so far */
    uint64_t bytes;     /* bytes given to update in all */
    uint8_t block[64];  /* the partial block, block_used bytes of it */
    size_t block_used;
} dm_sha256;

void dm_sha256_init(dm_sha256 *h);
void dm_sha256_update(dm_sha256 *h, const void *data, size_t n);
/* The digest as 64 lowercase hexadecimal digits and a NUL; h is spent. */
void dm_sha256_final_hex(dm_sha256 *h, char hex[65]);

#endif
