/* test_crc32c: CRC-32C (runtime/crc32c.c, the checksum of checkpoint tensors) against the
 * standard check value and known vectors (RFC 3720, B.4), against a bitwise reference on
 * every length and alignment the slicing-by-8 loop distinguishes, and in pieces. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "crc32c.h"

/* one bit at a time, straight from the definition */
static uint32_t reference(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? c >> 1 ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

int main(void) {
    int fails = 0;
    CHECK(dmrt_crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", (unsigned)dmrt_crc32c(0, "123456789", 9));
    CHECK(dmrt_crc32c(0, "", 0) == 0, "empty %08x", (unsigned)dmrt_crc32c(0, "", 0));
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xFF, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    CHECK(dmrt_crc32c(0, zeros, 32) == 0x8A9136AAu, "32 zeros %08x", (unsigned)dmrt_crc32c(0, zeros, 32));
    CHECK(dmrt_crc32c(0, ones, 32) == 0x62A8AB43u, "32 0xff %08x", (unsigned)dmrt_crc32c(0, ones, 32));
    CHECK(dmrt_crc32c(0, inc, 32) == 0x46DD794Eu, "0..31 %08x", (unsigned)dmrt_crc32c(0, inc, 32));
    unsigned char buf[200];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
    for (size_t off = 0; off < 8; off++)
        for (size_t n = 0; off + n <= sizeof buf; n++) {
            uint32_t want = reference(buf + off, n), got = dmrt_crc32c(0, buf + off, n);
            CHECK(got == want, "offset %zu, %zu bytes: %08x, the reference %08x", off, n, (unsigned)got, (unsigned)want);
            size_t half = n / 3;
            uint32_t pieces = dmrt_crc32c(dmrt_crc32c(0, buf + off, half), buf + off + half, n - half);
            CHECK(pieces == want, "offset %zu, %zu bytes in two pieces: %08x", off, n, (unsigned)pieces);
        }
    char hex[9];
    dmrt_crc32c_hex(0xE3069283u, hex);
    CHECK(strcmp(hex, "e3069283") == 0, "hex %s", hex);
    return fails ? 1 : 0;
}
