/* crc32c.h: CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78, initial and
 * final value 0xFFFFFFFF), the checksum of checkpoint tensors ("dmc.crc32c.<name>" in a
 * checkpoint's metadata, docs/trainer.md). Software, slicing by 8; crc32c.c. Not installed.
 *
 * dmrt_crc32c(0, "123456789", 9) == 0xE3069283 (the standard check value). To checksum in
 * pieces, pass the previous result as crc: dmrt_crc32c(dmrt_crc32c(0, a, n), b, m) is the
 * CRC of a followed by b. */
#ifndef DMRT_CRC32C_H
#define DMRT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

uint32_t dmrt_crc32c(uint32_t crc, const void *data, size_t n);

/* The checksum as the metadata holds it: 8 lowercase hex digits and a NUL into hex[9]. */
void dmrt_crc32c_hex(uint32_t crc, char hex[9]);

#endif
