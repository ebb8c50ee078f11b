/* test_safetensors: round trip, standard layout, atomic writes, a corpus of bad files
 * whose messages must name the file and the problem, and a large file read mapped, not
 * copied into the process's own memory. */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dmrt.h"
#include "testutil.h"

/* u64 header length + header + `data` zero bytes (or `hlen_override` if != 0). */
static int write_raw(const char *path, const char *header, size_t data, uint64_t hlen_override) {
    size_t h = strlen(header), n = 8 + h + data;
    unsigned char *buf = calloc(1, n);
    uint64_t len = hlen_override ? hlen_override : h;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, h);
    int rc = tu_write(path, buf, n);
    free(buf);
    return rc;
}

static int round_trip(const char *dir) {
    int fails = 0;
    char path[4096], err[1024];
    tu_path(path, sizeof path, dir, "rt.safetensors");
    float w[12], bias[4], scalar[1] = {3.25f};
    int32_t labels[5] = {0, -1, 7, 2147483647, -2147483647 - 1};
    for (int i = 0; i < 12; i++) w[i] = (float)i * 0.5f - 2.0f;
    for (int i = 0; i < 4; i++) bias[i] = -(float)i;
    const dmrt_tensor_desc descs[] = {
        {.name = "fc1.weight", .dtype = DMRT_F32, .rank = 2, .shape = {3, 4}, .numel = 12},
        {.name = "fc1.bias", .dtype = DMRT_F32, .rank = 1, .shape = {4}, .numel = 4},
        {.name = "labels", .dtype = DMRT_I32, .rank = 1, .shape = {5}, .numel = 5},
        {.name = "scalar", .dtype = DMRT_F32, .rank = 0, .numel = 1},
        {.name = "empty", .dtype = DMRT_F32, .rank = 2, .shape = {0, 3}, .numel = 0},
    };
    const void *data[] = {w, bias, labels, scalar, NULL};
    int rc = dmrt_st_write(path, 5, descs, data, err, sizeof err);
    CHECK(rc == 0, "write: %s", err);
    CHECK(tu_count_tmp(dir) == 0, "temporary file left behind");

    dmrt_st_file f;
    rc = dmrt_st_read(&f, path, err, sizeof err);
    CHECK(rc == 0, "read: %s", err);
    if (rc != 0) return fails;
    CHECK(f.n_tensors == 5, "n_tensors %d", f.n_tensors);
    for (int i = 0; i < 5; i++) {
        const dmrt_st_tensor *t = dmrt_st_find(&f, descs[i].name);
        CHECK(t != NULL, "tensor '%s' not found", descs[i].name);
        if (!t) continue;
        CHECK(t->dtype == descs[i].dtype && t->rank == descs[i].rank &&
                  t->numel == descs[i].numel &&
                  memcmp(t->shape, descs[i].shape, sizeof(int64_t) * (size_t)t->rank) == 0,
              "tensor '%s': dtype/shape differ", descs[i].name);
        size_t bytes = (size_t)descs[i].numel * 4;
        CHECK(bytes == 0 || memcmp(t->data, data[i], bytes) == 0, "tensor '%s': data differ",
              descs[i].name);
    }
    CHECK(dmrt_st_find(&f, "nope") == NULL, "found a tensor that is not there");
    CHECK(strcmp(f.path, path) == 0, "path");

    /* Standard layout: length, JSON padded with spaces to 8, data in the given
     * order, contiguous from 0, to the end of the file. */
    const unsigned char *b = f.buffer;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    CHECK(b[8] == '{', "header does not start with '{'");
    size_t end = 8 + hlen;
    while (end > 8 && b[end - 1] == ' ') end--;
    CHECK(b[end - 1] == '}', "header padding is not spaces after the JSON");
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, hlen, 0, &jerr);
    CHECK(root != NULL, "header JSON: %s", jerr.text);
    int64_t off = 0;
    for (int i = 0; root && i < 5; i++) {
        json_t *o = json_object_get(json_object_get(root, descs[i].name), "data_offsets");
        int64_t b0 = json_integer_value(json_array_get(o, 0));
        int64_t b1 = json_integer_value(json_array_get(o, 1));
        CHECK(b0 == off && b1 == off + descs[i].numel * 4, "'%s': offsets [%lld, %lld], want from %lld",
              descs[i].name, (long long)b0, (long long)b1, (long long)off);
        off = b1;
    }
    CHECK(f.size == 8 + hlen + (uint64_t)off, "file size %zu, want %llu", f.size,
          (unsigned long long)(8 + hlen + (uint64_t)off));
    json_decref(root);
    dmrt_st_close(&f);

    /* the writer refuses duplicate names */
    const dmrt_tensor_desc dup[] = {descs[0], descs[0]};
    const void *dd[] = {w, w};
    rc = dmrt_st_write(path, 2, dup, dd, err, sizeof err);
    CHECK(rc != 0, "duplicate names accepted");
    if (rc != 0) CHECK_MSG(err, path, "appears twice");

    /* __metadata__ is skipped */
    char p2[4096];
    tu_path(p2, sizeof p2, dir, "meta.safetensors");
    write_raw(p2,
              "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"I32\",\"shape\":[2],"
              "\"data_offsets\":[0,8]}}",
              8, 0);
    rc = dmrt_st_read(&f, p2, err, sizeof err);
    CHECK(rc == 0 && f.n_tensors == 1 && dmrt_st_find(&f, "a"), "metadata file: %s", rc ? err : "");
    if (rc == 0) dmrt_st_close(&f);
    return fails;
}

static int atomic(const char *dir) {
    int fails = 0;
    char path[4096], err[1024];
    float v[4] = {1, 2, 3, 4};
    const dmrt_tensor_desc d = {.name = "v", .dtype = DMRT_F32, .rank = 1, .shape = {4}, .numel = 4};
    const void *data[] = {v};

    /* directory that does not exist */
    tu_path(path, sizeof path, dir, "no/such/dir/x.safetensors");
    int rc = dmrt_st_write(path, 1, &d, data, err, sizeof err);
    CHECK(rc != 0, "write into a missing directory succeeded");
    if (rc) CHECK_MSG(err, path, "cannot create temporary file");

    /* target is a directory: refused before a temporary file is made */
    tu_path(path, sizeof path, dir, "adir");
    mkdir(path, 0755);
    rc = dmrt_st_write(path, 1, &d, data, err, sizeof err);
    CHECK(rc != 0, "write over a directory succeeded");
    if (rc) CHECK_MSG(err, path, "not a regular file (a directory)");
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "directory replaced");
    CHECK(tu_count_tmp(dir) == 0, "temporary file left after a failed rename");

    /* failure in the middle of writing (file size limit): old file intact */
    tu_path(path, sizeof path, dir, "old.safetensors");
    rc = dmrt_st_write(path, 1, &d, data, err, sizeof err);
    CHECK(rc == 0, "write: %s", err);
    size_t old_size = 0;
    char *old = tu_read(path, &old_size);
    pid_t pid = fork();
    if (pid == 0) {
        enum { BIG = 1 << 20 };
        float *big = calloc(BIG, sizeof(float));
        const dmrt_tensor_desc bd = {.name = "big", .dtype = DMRT_F32, .rank = 1, .shape = {BIG}, .numel = BIG};
        const void *bdata[] = {big};
        struct rlimit rl = {.rlim_cur = 65536, .rlim_max = 65536};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(3);
        char e2[1024];
        int r = dmrt_st_write(path, 1, &bd, bdata, e2, sizeof e2);
        if (r == 0) _exit(1);
        if (!strstr(e2, path) || !strstr(e2, "unchanged")) {
            fprintf(stderr, "unexpected message: %s\n", e2);
            _exit(2);
        }
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "write beyond the file size limit: child status %d", WEXITSTATUS(status));
    size_t now_size = 0;
    char *now = tu_read(path, &now_size);
    CHECK(old && now && old_size == now_size && memcmp(old, now, old_size) == 0,
          "old file changed by a failed write");
    CHECK(tu_count_tmp(dir) == 0, "temporary file left after a failed write");
    free(old);
    free(now);

    /* a successful write replaces the old file */
    v[0] = 42;
    rc = dmrt_st_write(path, 1, &d, data, err, sizeof err);
    dmrt_st_file f;
    rc = rc ? rc : dmrt_st_read(&f, path, err, sizeof err);
    CHECK(rc == 0, "%s", err);
    if (rc == 0) {
        CHECK(((const float *)dmrt_st_find(&f, "v")->data)[0] == 42.0f, "not replaced");
        dmrt_st_close(&f);
    }
    return fails;
}

/* Two writers of one path at once, in one process (one pid: ranks' threads; or two
 * containers' processes of the same pid): each writes through a temporary file of its own,
 * both succeed, and the file is the whole of one of them. (With PATH.tmp.<pid> they shared
 * one temporary file: one's rename failed, or the file held the other's bytes.) */
enum { RACE_FLOATS = 1 << 22 };
typedef struct race_writer {
    const char *path;
    float value;
    int rc;
    char err[1024];
} race_writer;

static void *race_write(void *arg) {
    race_writer *w = arg;
    float *x = malloc(RACE_FLOATS * sizeof(float));
    if (!x) {
        w->rc = -2;
        return NULL;
    }
    for (int i = 0; i < RACE_FLOATS; i++) x[i] = w->value;
    const dmrt_tensor_desc d = {.name = "x", .dtype = DMRT_F32, .rank = 1, .shape = {RACE_FLOATS}, .numel = RACE_FLOATS};
    const void *data[] = {x};
    w->rc = dmrt_st_write(w->path, 1, &d, data, w->err, sizeof w->err);
    free(x);
    return NULL;
}

static int concurrent_writers(const char *dir) {
    int fails = 0;
    char path[4096];
    tu_path(path, sizeof path, dir, "raced.safetensors");
    for (int round = 0; round < 4; round++) {
        race_writer w[2] = {{.path = path, .value = 1.0f}, {.path = path, .value = 2.0f}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, race_write, &w[i]);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        CHECK(w[0].rc == 0 && w[1].rc == 0, "round %d: two writers of one path: %s / %s", round,
              w[0].rc ? w[0].err : "ok", w[1].rc ? w[1].err : "ok");
        dmrt_st_file f;
        char err[1024];
        int rc = dmrt_st_read(&f, path, err, sizeof err);
        CHECK(rc == 0, "round %d: the raced file does not read: %s", round, err);
        if (rc == 0) {
            const float *x = dmrt_st_find(&f, "x")->data;
            int mixed = 0;
            for (int i = 1; i < RACE_FLOATS; i++) mixed |= x[i] != x[0];
            CHECK(!mixed && (x[0] == 1.0f || x[0] == 2.0f), "round %d: the file mixes the two writers' bytes", round);
            dmrt_st_close(&f);
        }
        CHECK(tu_count_tmp(dir) == 0, "round %d: a temporary file is left", round);
    }
    /* the permissions a file fopen creates would have (mkstemp's own are 0600) */
    mode_t mask = umask(022);
    umask(mask);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == (0666 & ~mask), "the file's mode is %o, want %o",
          (unsigned)(st.st_mode & 0777), (unsigned)(0666 & ~mask));
    return fails;
}

/* Each bad file: what to write and a phrase its message must contain. */
typedef struct bad_case {
    const char *name;
    const char *header;
    size_t data;
    uint64_t hlen; /* != 0: length field lies */
    const char *phrase;
} bad_case;

static const bad_case bad_cases[] = {
    {"hlen_beyond", "{}", 16, 1000, "beyond the end of the file"},
    {"not_json", "{\"a\": {\"dtype\": ", 0, 0, "not valid JSON"},
    {"not_object", "[1, 2]", 0, 0, "not a JSON object"},
    {"duplicate", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0,
     "not valid JSON"},
    {"dtype", "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, 0,
     "tensor 'w': unsupported dtype 'F16'"},
    {"no_dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, "tensor 'w': missing \"dtype\""},
    {"neg_shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8, 0,
     "tensor 'w': shape entry 1"},
    {"rank", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
     4, 0, "rank 9"},
    {"out_of_range", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, 0,
     "tensor 'w': data_offsets [0, 16] are out of range"},
    {"offsets_shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, 0,
     "not [begin, end]"},
    {"reversed", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, 0,
     "end before they begin"},
    {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0,
     "tensors 'a' and 'b' overlap"},
    {"mismatch", "{\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,12]}}", 48, 0,
     "tensor 'fc1.weight': data_offsets [0, 12] hold 12 bytes but shape [3, 4] of F32 needs 48"},
    /* the tensors must cover the data area exactly (the reference reader's
     * MetadataIncompleteBuffer): bytes after the last tensor (another file appended), a gap */
    {"trailing", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, 0,
     "4 bytes after the last tensor: the tensors cover 8 of the data area's 12 bytes"},
    {"gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, 0,
     "a gap of 4 bytes before tensor 'b' (data_offsets [8, 12])"},
    {"gap_first", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0,
     "a gap of 4 bytes before tensor 'w'"},
    {"data_only", "{}", 8, 0, "8 bytes after the last tensor"},
    {"entry", "{\"w\":[1,2]}", 0, 0, "tensor 'w': entry is not a JSON object"},
    {"metadata", "{\"__metadata__\":3}", 0, 0, "\"__metadata__\" is not a JSON object"},
};

static int bad_files(const char *dir) {
    int fails = 0;
    char path[4096], err[1024];
    dmrt_st_file f;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        char name[128];
        snprintf(name, sizeof name, "bad_%s.safetensors", c->name);
        tu_path(path, sizeof path, dir, name);
        write_raw(path, c->header, c->data, c->hlen);
        err[0] = '\0';
        int rc = dmrt_st_read(&f, path, err, sizeof err);
        CHECK(rc != 0, "%s: accepted", c->name);
        if (rc == 0) dmrt_st_close(&f);
        else CHECK_MSG(err, path, c->phrase);
        CHECK(f.buffer == NULL && f.tensors == NULL, "%s: file not reset after failure", c->name);
    }

    /* shorter than the length field */
    tu_path(path, sizeof path, dir, "bad_short.safetensors");
    tu_write(path, "\x10\0\0\0\0", 5);
    CHECK(dmrt_st_read(&f, path, err, sizeof err) != 0, "5-byte file accepted");
    CHECK_MSG(err, path, "too short");

    /* a good file cut short: in the data, then in the header */
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    tu_path(path, sizeof path, dir, "bad_truncated.safetensors");
    write_raw(path, hdr, 16, 0);
    size_t size;
    char *full = tu_read(path, &size);
    tu_write(path, full, size - 3);
    CHECK(dmrt_st_read(&f, path, err, sizeof err) != 0, "truncated data accepted");
    CHECK_MSG(err, path, "out of range");
    tu_write(path, full, 20);
    CHECK(dmrt_st_read(&f, path, err, sizeof err) != 0, "truncated header accepted");
    CHECK_MSG(err, path, "beyond the end of the file");
    free(full);

    tu_path(path, sizeof path, dir, "missing.safetensors");
    CHECK(dmrt_st_read(&f, path, err, sizeof err) != 0, "missing file accepted");
    CHECK_MSG(err, path, "cannot open");
    return fails;
}

/* __metadata__: written as string pairs, read back by key; non-string values are skipped
 * (the format allows strings only) and a file without one has none. */
static int metadata(const char *dir) {
    int fails = 0;
    char path[4200], err[1024];
    snprintf(path, sizeof path, "%s/meta.safetensors", dir);
    float x[2] = {1.5f, -2.0f};
    dmrt_tensor_desc d = {"x", DMRT_F32, 1, {2}, 2};
    const void *data[1] = {x};
    const char *keys[2] = {"dmc.step", "note"}, *values[2] = {"5", "caf\xc3\xa9"};
    CHECK(dmrt_st_write_meta(path, 1, &d, data, 2, keys, values, err, sizeof err) == 0, "write_meta: %s", err);
    dmrt_st_file f;
    CHECK(dmrt_st_read(&f, path, err, sizeof err) == 0, "read: %s", err);
    if (fails) return fails;
    CHECK(f.n_tensors == 1 && f.n_meta == 2, "1 tensor and 2 metadata pairs, got %d and %d", f.n_tensors, f.n_meta);
    CHECK(dmrt_st_meta(&f, "dmc.step") && strcmp(dmrt_st_meta(&f, "dmc.step"), "5") == 0, "dmc.step read back");
    CHECK(dmrt_st_meta(&f, "note") && strcmp(dmrt_st_meta(&f, "note"), "caf\xc3\xa9") == 0, "UTF-8 value read back");
    CHECK(dmrt_st_meta(&f, "missing") == NULL, "an absent key is NULL");
    dmrt_st_close(&f);
    const char *bad_values[1] = {"\xff"};
    CHECK(dmrt_st_write_meta(path, 1, &d, data, 1, keys, bad_values, err, sizeof err) != 0, "a value that is not UTF-8 is refused");
    CHECK_MSG(err, path, "metadata 'dmc.step'");
    snprintf(path, sizeof path, "%s/mixed.safetensors", dir);
    CHECK(write_raw(path, "{\"__metadata__\":{\"a\":\"b\",\"n\":3}}", 0, 0) == 0, "write raw");
    CHECK(dmrt_st_read(&f, path, err, sizeof err) == 0, "read mixed metadata: %s", err);
    if (fails) return fails;
    CHECK(f.n_meta == 1 && strcmp(dmrt_st_meta(&f, "a"), "b") == 0 && !dmrt_st_meta(&f, "n"), "non-string values skipped");
    dmrt_st_close(&f);
    return fails;
}

/* The process's anonymous resident memory (RssAnon of /proc/self/status), in kB; -1 where
 * the system does not say. */
static long rss_anon_kb(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (fp && fgets(line, sizeof line, fp))
        if (strncmp(line, "RssAnon:", 8) == 0) kb = strtol(line + 8, NULL, 10);
    if (fp) fclose(fp);
    return kb;
}

/* A 32 MiB file is mapped (f.mapped), and reading every byte of its tensor leaves the
 * process's anonymous memory within half of that: every rank of a machine reading the same
 * weights shares the file's pages instead of holding a copy each. */
static int mapped(const char *dir) {
    int fails = 0;
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/large.safetensors", dir);
    const size_t bytes = (size_t)32 << 20;
    char header[160];
    snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}", bytes / 4, bytes);
    CHECK(write_raw(path, header, bytes, 0) == 0, "writing %s", path);
    long before = rss_anon_kb();
    dmrt_st_file f;
    if (dmrt_st_read(&f, path, err, sizeof err) != 0) {
        CHECK(0, "read: %s", err);
        return fails;
    }
    CHECK(f.mapped == f.size && f.size > bytes, "%zu bytes mapped of %zu", f.mapped, f.size);
    const dmrt_st_tensor *t = dmrt_st_find(&f, "t");
    if (!t) {
        CHECK(0, "tensor 't' not found");
        dmrt_st_close(&f);
        return fails;
    }
    const unsigned char *data = t->data;
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i++) sum += data[i];
    long after = rss_anon_kb();
    dmrt_st_close(&f);
    CHECK(sum == 0, "the zeros read back sum to %u", sum);
    if (before >= 0 && after >= 0)
        CHECK(after - before < (long)(bytes >> 11), "anonymous memory grew by %ld kB reading a %zu kB file", after - before,
              bytes >> 10);
    unlink(path);
    return fails;
}

int main(void) {
    char dir[4096];
    if (tu_mkdtemp(dir, sizeof dir) != 0) {
        perror("mkdtemp");
        return 1;
    }
    int fails = round_trip(dir) + atomic(dir) + concurrent_writers(dir) + bad_files(dir) + metadata(dir) + mapped(dir);
    tu_rmdir(dir);
    if (fails) fprintf(stderr, "test_safetensors: %d failures\n", fails);
    return fails != 0;
}
