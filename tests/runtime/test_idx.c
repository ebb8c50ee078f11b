/* test_idx: IDX images and labels, plain and gzipped, and broken files. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "dmrt.h"
#include "testutil.h"

/* IDX bytes: magic, dims (big-endian), then n * row bytes of i * 37 % 256. */
static unsigned char *make_idx(uint32_t magic, int ndims, const uint32_t *dims, size_t *size) {
    size_t data = 1;
    for (int i = 0; i < ndims; i++) data *= dims[i];
    size_t n = 4 + 4 * (size_t)ndims + data;
    unsigned char *b = malloc(n);
    uint32_t words[4] = {magic, dims[0], ndims > 1 ? dims[1] : 0, ndims > 2 ? dims[2] : 0};
    for (int w = 0; w <= ndims; w++)
        for (int k = 0; k < 4; k++) b[4 * w + k] = (unsigned char)(words[w] >> (24 - 8 * k));
    for (size_t i = 0; i < data; i++) b[4 + 4 * ndims + i] = (unsigned char)(i * 37 % 256);
    *size = n;
    return b;
}

static int write_gz(const char *path, const void *data, size_t n) {
    gzFile gz = gzopen(path, "wb");
    if (!gz) return -1;
    int w = gzwrite(gz, data, (unsigned)n);
    return gzclose(gz) == Z_OK && (size_t)w == n ? 0 : -1;
}

static int check_images(const dmrt_idx *x, const char *what) {
    int fails = 0;
    CHECK(x->n == 3 && x->row_size == 6 && x->images && !x->labels, "%s: n %lld row %lld", what,
          (long long)x->n, (long long)x->row_size);
    for (int i = 0; x->images && i < 18; i++)
        CHECK(x->images[i] == (float)(i * 37 % 256) / 255.0f, "%s: pixel %d = %g", what, i,
              (double)x->images[i]);
    return fails;
}

/* The images (img, n bytes), plain and gzipped, and labels: read back. */
static int test_reads(const char *dir, const unsigned char *img, size_t n) {
    int fails = 0;
    char path[4096], err[1024];
    dmrt_idx x;
    /* images, plain and gzipped */
    tu_path(path, sizeof path, dir, "img-idx3-ubyte");
    tu_write(path, img, n);
    int rc = dmrt_idx_read(&x, path, err, sizeof err);
    CHECK(rc == 0, "plain images: %s", err);
    if (rc == 0) fails += check_images(&x, "plain"), dmrt_idx_free(&x);
    tu_path(path, sizeof path, dir, "img-idx3-ubyte.gz");
    write_gz(path, img, n);
    rc = dmrt_idx_read(&x, path, err, sizeof err);
    CHECK(rc == 0, "gzipped images: %s", err);
    if (rc == 0) fails += check_images(&x, "gzip"), dmrt_idx_free(&x);

    /* labels */
    static const uint32_t ldims[1] = {5};
    size_t ln;
    unsigned char *lab = make_idx(0x00000801u, 1, ldims, &ln);
    tu_path(path, sizeof path, dir, "lab-idx1-ubyte.gz");
    write_gz(path, lab, ln);
    rc = dmrt_idx_read(&x, path, err, sizeof err);
    CHECK(rc == 0 && x.n == 5 && x.row_size == 1 && x.labels && !x.images, "labels: %s", err);
    for (int i = 0; rc == 0 && i < 5; i++)
        CHECK(x.labels[i] == i * 37 % 256, "label %d = %d", i, (int)x.labels[i]);
    if (rc == 0) dmrt_idx_free(&x);
    free(lab);
    return fails;
}

/* Files cut short (the data, the gzip stream, the header): refused, the output reset. */
static int test_truncated(const char *dir, const unsigned char *img, size_t n) {
    int fails = 0;
    char path[4096], err[1024];
    dmrt_idx x;
    /* truncated data, plain and gzipped (complete stream of a short file) */
    tu_path(path, sizeof path, dir, "short-idx3-ubyte");
    tu_write(path, img, n - 5);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "truncated plain accepted");
    CHECK_MSG(err, path, "truncated");
    tu_path(path, sizeof path, dir, "short-idx3-ubyte.gz");
    write_gz(path, img, n - 5);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "truncated gzip accepted");
    CHECK_MSG(err, path, "truncated");
    CHECK(x.images == NULL && x.n == 0, "output not reset after failure");

    /* gzip stream itself cut short */
    size_t gzn;
    tu_path(path, sizeof path, dir, "img-idx3-ubyte.gz");
    char *gzb = tu_read(path, &gzn);
    tu_path(path, sizeof path, dir, "cut-idx3-ubyte.gz");
    tu_write(path, gzb, gzn - 12);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "cut gzip stream accepted");
    CHECK_MSG(err, path, "truncated");

    /* a wrong CRC in the gzip trailer: corrupt, the path named once (zlib's message has it too) */
    gzb[gzn - 8] ^= 0x55;
    tu_path(path, sizeof path, dir, "crc-idx3-ubyte.gz");
    tu_write(path, gzb, gzn);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "gzip stream with a bad CRC accepted");
    CHECK_MSG(err, path, "corrupt gzip data");
    CHECK(strstr(err, path) == err && !strstr(err + strlen(path), path), "the path twice: %s", err);
    free(gzb);

    /* header cut inside the dims */
    tu_path(path, sizeof path, dir, "hdr-idx3-ubyte");
    tu_write(path, img, 10);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "cut header accepted");
    CHECK_MSG(err, path, "truncated in the header");
    return fails;
}

/* Headers that lie (magic, zero-sized or too large dims), trailing bytes, no file: refused.
 * img is changed and put back. */
static int test_bad_headers(const char *dir, unsigned char *img, size_t n) {
    int fails = 0;
    char path[4096], err[1024];
    dmrt_idx x;
    /* bad magic */
    img[3] = 0x08;
    tu_path(path, sizeof path, dir, "magic-idx3-ubyte");
    tu_write(path, img, n);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "bad magic accepted");
    CHECK_MSG(err, path, "bad magic number 0x00000808");
    img[3] = 0x03;

    /* zero-sized images */
    img[11] = 0;
    tu_path(path, sizeof path, dir, "zero-idx3-ubyte");
    tu_write(path, img, n);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "0-pixel images accepted");
    CHECK_MSG(err, path, "images of 0 x 3 pixels");
    img[11] = 2;

    /* dims whose product is past what the reader allows (4 GiB), and past int64_t: refused
     * from the header, before any allocation */
    static const unsigned char huge[][4] = {{0x80, 0, 0, 0}, {0xff, 0xff, 0xff, 0xff}};
    unsigned char saved[12];
    memcpy(saved, img + 4, 12);
    for (int h = 0; h < 3; h++) {
        for (int d = 0; d < 3; d++) memcpy(img + 4 + 4 * d, huge[h > 0], 4);
        if (h == 2) memset(img + 4, 0, 4); /* no examples, each of 2^64 - 2^33 + 1 bytes */
        tu_path(path, sizeof path, dir, h == 2 ? "none-idx3-ubyte" : h ? "huge-idx3-ubyte" : "big-idx3-ubyte");
        tu_write(path, img, n);
        CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "header %d of too large dims accepted", h);
        CHECK_MSG(err, path, "is more than this reader allows");
    }
    memcpy(img + 4, saved, 12);

    /* trailing bytes */
    unsigned char *longer = malloc(n + 2);
    memcpy(longer, img, n);
    longer[n] = longer[n + 1] = 0;
    tu_path(path, sizeof path, dir, "long-idx3-ubyte");
    tu_write(path, longer, n + 2);
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "trailing bytes accepted");
    CHECK_MSG(err, path, "trailing bytes");
    free(longer);

    tu_path(path, sizeof path, dir, "missing-idx3-ubyte.gz");
    CHECK(dmrt_idx_read(&x, path, err, sizeof err) != 0, "missing file accepted");
    CHECK_MSG(err, path, "cannot open");
    return fails;
}

int main(void) {
    int fails = 0;
    char dir[4096];
    if (tu_mkdtemp(dir, sizeof dir) != 0) return 1;
    /* images 3 x (2, 3) */
    static const uint32_t idims[3] = {3, 2, 3};
    size_t n;
    unsigned char *img = make_idx(0x00000803u, 3, idims, &n);
    fails += test_reads(dir, img, n);
    fails += test_truncated(dir, img, n);
    fails += test_bad_headers(dir, img, n);
    free(img);
    tu_rmdir(dir);
    if (fails) fprintf(stderr, "test_idx: %d failures\n", fails);
    return fails != 0;
}
