/* test_sha256.c: driver/sha256.c (the build cache's key) against FIPS 180-2's examples
 * (appendix B: "abc", the 448-bit message, a million 'a') and the empty message, each fed
 * in pieces of every size from 1 to 130 bytes (blocks split anywhere; the million in
 * pieces of 1, 7, 64 and 130 bytes and repeats of 1000). */
#include <stdio.h>
#include <string.h>

#include "sha256.h"

static int failures;

static void digest(const char *text, size_t n, size_t piece, size_t repeat, char hex[65]) {
    dm_sha256 h;
    dm_sha256_init(&h);
    for (size_t r = 0; r < repeat; r++)
        for (size_t at = 0; at < n; at += piece) dm_sha256_update(&h, text + at, n - at < piece ? n - at : piece);
    dm_sha256_final_hex(&h, hex);
}

static void expect(const char *label, const char *text, size_t repeat, const char *want) {
    size_t n = strlen(text), pieces[130], n_pieces = 0;
    if (repeat == 1)
        for (size_t piece = 1; piece <= 130; piece++) pieces[n_pieces++] = piece;
    else
        for (size_t i = 0; i < 4; i++) pieces[n_pieces++] = (size_t[]){1, 7, 64, 130}[i];
    for (size_t i = 0; i < n_pieces; i++) {
        char hex[65];
        digest(text, n, pieces[i], repeat, hex);
        if (strcmp(hex, want) != 0) {
            printf("FAIL: %s in pieces of %zu: %s, want %s\n", label, pieces[i], hex, want);
            failures++;
            return;
        }
    }
    printf("ok: %s\n", label);
}

int main(void) {
    expect("empty", "", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    expect("abc", "abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect("448 bits", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
           "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static char tens[1001];
    memset(tens, 'a', 1000);
    expect("a million 'a'", tens, 1000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    printf("%d passed, %d failed\n", 4 - failures, failures);
    return failures != 0;
}
