/* build_cache.c: dmc run's cache of built programs (build_cache.h). */
#define _POSIX_C_SOURCE 200809L
#include "build_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sha256.h"
#include "supervise.h"

#ifndef DMC_VERSION
#define DMC_VERSION "unknown"
#endif

/* Bumped when what the key covers changes, so that no older key can match a newer build. */
static const char key_format[] = "dmc build cache 1, dmc " DMC_VERSION "\n";

/* The environment variables compilers and their wrappers read (gcc, clang, mpicc, nvcc). */
static const char *const compiler_environment[] = {
    "CPATH",      "C_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX",   "COMPILER_PATH",     "OMPI_CC",
    "OMPI_CFLAGS", "OMPI_LDFLAGS",  "OMPI_LIBS",    "MPICH_CC",          "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
};

static void add_text(dm_build_cache *c, const char *text) { dm_sha256_update(c->hash, text, strlen(text) + 1); }

/* The file's bytes (and its length, so that two files cannot run together); 0, or -1 when
 * it cannot be read (the key then holds the error: no hit on a file unread). */
static int add_file(dm_build_cache *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        add_text(c, "unreadable");
        return -1;
    }
    char buf[1 << 16];
    size_t n, total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        dm_sha256_update(c->hash, buf, n);
        total += n;
    }
    int failed = ferror(f);
    fclose(f);
    char length[32];
    snprintf(length, sizeof length, "%s%zu", failed ? "read error " : "", total);
    add_text(c, length);
    return failed ? -1 : 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int has_suffix(const char *name, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    return n >= s && strcmp(name + n - s, suffix) == 0;
}

/* A file's size, time of change and inode: what stands for a library's bytes, which a
 * sanitized dmc (unoptimised) hashed at 8 MB/s, most of a second a build. */
static void add_identity(dm_build_cache *c, const struct stat *st) {
    char identity[96];
    snprintf(identity, sizeof identity, "%lld %lld.%09ld %lld", (long long)st->st_size, (long long)st->st_mtim.tv_sec,
             st->st_mtim.tv_nsec, (long long)st->st_ino);
    add_text(c, identity);
}

/* The regular files of dir that keep(name) accepts, in name order: their names and bytes,
 * or their identities (add_identity) where by_identity (not dir's path: the build
 * directory's is new each time). */
static void add_files(dm_build_cache *c, const char *dir, int (*keep)(const char *name), int by_identity) {
    DIR *d = opendir(dir);
    if (!d) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!keep(e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) break;
            names = grown;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        char path[PATH_MAX];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]) < (int)sizeof path && stat(path, &st) == 0 &&
            S_ISREG(st.st_mode)) {
            add_text(c, names[i]);
            if (by_identity) add_identity(c, &st);
            else add_file(c, path);
        }
        free(names[i]);
    }
    free(names);
}

static int runtime_header(const char *name) { return strncmp(name, "dmrt", 4) == 0 && has_suffix(name, ".h"); }
static int runtime_library(const char *name) { return strncmp(name, "libdmrt", 7) == 0; }
/* what the compilers read of the build directory: dmc's sources and headers */
static int build_source(const char *name) {
    return has_suffix(name, ".c") || has_suffix(name, ".h") || has_suffix(name, ".cu") || has_suffix(name, ".cuh");
}

/* The lines of /proc/cpuinfo that say which CPU -march=native compiles for. */
static void add_cpu(dm_build_cache *c) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    int model = 0, flags = 0;
    while (fgets(line, sizeof line, f) && !(model && flags)) {
        if (!model && strncmp(line, "model name", 10) == 0) model = 1, add_text(c, line);
        if (!flags && (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) flags = 1, add_text(c, line);
    }
    fclose(f);
}

/* A program's path, size and time of change: argv0 itself when it names a path, else the
 * first executable of that name on $PATH. */
static void add_program(dm_build_cache *c, const char *argv0) {
    char path[PATH_MAX] = "";
    if (strchr(argv0, '/')) {
        snprintf(path, sizeof path, "%s", argv0);
    } else {
        const char *dirs = getenv("PATH");
        for (const char *p = dirs ? dirs : ""; *p;) {
            size_t len = strcspn(p, ":");
            if (snprintf(path, sizeof path, "%.*s/%s", (int)len, len ? p : ".", argv0) < (int)sizeof path &&
                access(path, X_OK) == 0)
                break;
            path[0] = '\0';
            p += len + (p[len] == ':');
        }
    }
    struct stat st;
    add_text(c, path[0] ? path : argv0);
    if (path[0] && stat(path, &st) == 0) add_identity(c, &st);
    else add_text(c, "not found");
}

/* The cache's directory, or NULL when off. */
static const char *cache_dir(char dir[PATH_MAX]) {
    const char *env = getenv("DMC_BUILD_CACHE"), *home;
    int n;
    if (env && *env) {
        if (strcmp(env, "off") == 0) return NULL;
        n = snprintf(dir, PATH_MAX, "%s", env);
    } else if ((home = getenv("XDG_CACHE_HOME")) && *home) {
        n = snprintf(dir, PATH_MAX, "%s/dmc/builds", home);
    } else if ((home = getenv("HOME")) && *home) {
        n = snprintf(dir, PATH_MAX, "%s/.cache/dmc/builds", home);
    } else {
        return NULL;
    }
    return n > 0 && n < PATH_MAX - 80 ? dir : NULL;
}

int dm_build_cache_begin(dm_build_cache *c, const char *build_dir, const char *const include_dirs[],
                         int n_include_dirs, const char *const lib_dirs[], int n_lib_dirs) {
    memset(c, 0, sizeof *c);
    if (!cache_dir(c->dir) || snprintf(c->build_dir, sizeof c->build_dir, "%s", build_dir) >= (int)sizeof c->build_dir)
        return 0;
    if (!(c->hash = malloc(sizeof(dm_sha256)))) return -1;
    c->enabled = 1;
    dm_sha256_init(c->hash);
    add_text(c, key_format);
    add_cpu(c);
    for (int i = 0; i < n_include_dirs; i++)
        if (i == 0 || strcmp(include_dirs[i], include_dirs[i - 1]) != 0) {
            add_text(c, include_dirs[i]);
            add_files(c, include_dirs[i], runtime_header, 0);
        }
    for (int i = 0; i < n_lib_dirs; i++)
        if (i == 0 || strcmp(lib_dirs[i], lib_dirs[i - 1]) != 0) {
            add_text(c, lib_dirs[i]);
            add_files(c, lib_dirs[i], runtime_library, 1);
        }
    return 0;
}

void dm_build_cache_add_command(dm_build_cache *c, char *const argv[]) {
    if (!c->enabled) return;
    size_t dir_len = strlen(c->build_dir);
    add_text(c, "command");
    for (int i = 0; argv[i]; i++) {
        /* the build directory is a new temporary one each time: its path is not the program's */
        for (const char *w = argv[i], *at; *w; w = at + dir_len) {
            at = dir_len ? strstr(w, c->build_dir) : NULL;
            if (!at) {
                dm_sha256_update(c->hash, w, strlen(w));
                break;
            }
            dm_sha256_update(c->hash, w, (size_t)(at - w));
            dm_sha256_update(c->hash, "<dir>", 5);
        }
        dm_sha256_update(c->hash, "", 1);
    }
    add_program(c, argv[0]);
}

/* Copies from to a new file to (mode 0755): 0, or -1 with errno set (to removed). */
static int copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY), out = in < 0 ? -1 : open(to, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    int status = in < 0 || out < 0 ? -1 : 0;
    char buf[1 << 16];
    ssize_t n = 0;
    while (status == 0 && (n = read(in, buf, sizeof buf)) > 0)
        for (ssize_t done = 0, w; status == 0 && done < n; done += w)
            if ((w = write(out, buf + done, (size_t)(n - done))) < 0) status = -1;
    if (n < 0) status = -1;
    int saved = errno;
    if (in >= 0) close(in);
    if (out >= 0 && close(out) != 0) status = -1, saved = errno;
    if (status != 0 && out >= 0) unlink(to);
    errno = saved;
    return status;
}

/* $DMC_BUILD_CACHE_LOG: a line a build, "hit|miss KEY PROGRAM", appended (.ci/run counts them). */
static void log_use(const char *what, const char *key, const char *exe) {
    const char *path = getenv("DMC_BUILD_CACHE_LOG");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f) return;
    const char *name = strrchr(exe, '/');
    fprintf(f, "%s %s %s\n", what, key, name ? name + 1 : exe);
    fclose(f);
}

int dm_build_cache_fetch(dm_build_cache *c, const char *exe) {
    if (!c->enabled) return 0;
    for (size_t i = 0; i < sizeof compiler_environment / sizeof *compiler_environment; i++) {
        const char *value = getenv(compiler_environment[i]);
        add_text(c, compiler_environment[i]);
        add_text(c, value ? value : "(unset)");
    }
    add_files(c, c->build_dir, build_source, 0);
    char key[65];
    dm_sha256_final_hex(c->hash, key);
    struct stat st;
    if (snprintf(c->entry, sizeof c->entry, "%s/%s", c->dir, key) >= (int)sizeof c->entry) {
        c->entry[0] = '\0';
        return 0;
    }
    int hit = stat(c->entry, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && copy_file(c->entry, exe) == 0;
    if (hit) utimensat(AT_FDCWD, c->entry, NULL, 0); /* used now: the last to be removed */
    log_use(hit ? "hit" : "miss", key, exe);
    return hit;
}

typedef struct {
    char name[80];
    long long bytes;
    struct timespec used;
} cache_entry;

static int least_recent_first(const void *a, const void *b) {
    const cache_entry *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

/* Removes the least recently used programs (not keep) while the cache holds more than its
 * limit, $DMC_BUILD_CACHE_MB MiB (default 1024). */
static void trim(const dm_build_cache *c, const char *keep) {
    const char *limit_env = getenv("DMC_BUILD_CACHE_MB");
    double limit_mb = limit_env && *limit_env ? atof(limit_env) : 1024;
    DIR *d = opendir(c->dir);
    if (!d) return;
    cache_entry *entries = NULL;
    size_t n = 0, cap = 0;
    long long total = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[PATH_MAX];
        struct stat st;
        /* entries are keys, 64 hexadecimal digits; temporary files start with ".new-" */
        if (snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name) >= (int)sizeof path || stat(path, &st) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        /* one a run killed while storing left: gone after an hour */
        if (strncmp(e->d_name, ".new-", 5) == 0 && st.st_mtim.tv_sec + 3600 < time(NULL)) unlink(path);
        if (strlen(e->d_name) != 64) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            cache_entry *grown = realloc(entries, cap * sizeof *entries);
            if (!grown) break;
            entries = grown;
        }
        snprintf(entries[n].name, sizeof entries[n].name, "%s", e->d_name);
        entries[n].bytes = (long long)st.st_size;
        entries[n].used = st.st_mtim;
        total += entries[n++].bytes;
    }
    closedir(d);
    if (n) qsort(entries, n, sizeof *entries, least_recent_first);
    for (size_t i = 0; i < n && total > limit_mb * 1048576.0; i++) {
        char path[PATH_MAX];
        if (strcmp(entries[i].name, keep) == 0) continue;
        if (snprintf(path, sizeof path, "%s/%s", c->dir, entries[i].name) < (int)sizeof path && unlink(path) == 0)
            total -= entries[i].bytes;
    }
    free(entries);
}

void dm_build_cache_store(dm_build_cache *c, const char *exe) {
    if (!c->enabled || !c->entry[0]) return;
    char temporary[PATH_MAX];
    if (snprintf(temporary, sizeof temporary, "%s/.new-%ld", c->dir, (long)getpid()) >= (int)sizeof temporary) return;
    if (dm_make_path(c->dir) != 0 || copy_file(exe, temporary) != 0 || rename(temporary, c->entry) != 0) {
        fprintf(stderr, "dmc: note: the build cache %s cannot be written (%s): the program is not kept there\n", c->dir,
                strerror(errno));
        unlink(temporary);
        return;
    }
    trim(c, strrchr(c->entry, '/') + 1);
}

void dm_build_cache_end(dm_build_cache *c) {
    free(c->hash);
    c->hash = NULL;
    c->enabled = 0;
}
