/* crc32c.c: CRC-32C in software, slicing by 8 (crc32c.h). The tables are built once, on
 * first use (pthread_once: checkpoints are written and read from rank threads). */
#include "crc32c.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 reflected */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? c >> 1 ^ CRC32C_POLY : c >> 1;
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) table[t][i] = table[t - 1][i] >> 8 ^ table[0][table[t - 1][i] & 0xff];
}

uint32_t dmrt_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&table_once, build_table);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c = c >> 8 ^ table[0][(c ^ *p++) & 0xff];
    for (; n >= 8; n -= 8, p += 8) {
        /* little-endian by bytes, so that the result does not depend on the host's order */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = table[7][lo & 0xff] ^ table[6][lo >> 8 & 0xff] ^ table[5][lo >> 16 & 0xff] ^ table[4][lo >> 24] ^
            table[3][hi & 0xff] ^ table[2][hi >> 8 & 0xff] ^ table[1][hi >> 16 & 0xff] ^ table[0][hi >> 24];
    }
    for (; n; n--) c = c >> 8 ^ table[0][(c ^ *p++) & 0xff];
    return ~c;
}

void dmrt_crc32c_hex(uint32_t crc, char hex[9]) { snprintf(hex, 9, "%08x", (unsigned)crc); }
