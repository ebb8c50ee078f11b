/* testutil.c: see testutil.h. */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int tu_mkdtemp(char *buf, size_t len) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, len, "%s/dmrt-test-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(buf) ? 0 : -1;
}

void tu_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            tu_path(p, sizeof p, dir, e->d_name);
            if (remove(p) != 0) tu_rmdir(p); /* a directory made by a test */
        }
        closedir(d);
    }
    rmdir(dir);
}

char *tu_path(char *buf, size_t len, const char *dir, const char *name) {
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

char *tu_read(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, fp)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    fclose(fp);
    if (buf) buf[n] = '\0';
    if (size) *size = n;
    return buf;
}

int tu_write(const char *path, const void *data, size_t size) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(data, 1, size, fp);
    return fclose(fp) == 0 && w == size ? 0 : -1;
}

int tu_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int tu_count_tmp(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

int tu_run(char *const *argv, const char *out_path, const char *err_path) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(127);
        close(o);
        close(e);
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

tu_output tu_run_capture(char *const *argv, const char *dir) {
    char op[4096], ep[4096];
    tu_path(op, sizeof op, dir, "stdout.txt");
    tu_path(ep, sizeof ep, dir, "stderr.txt");
    tu_output o = {0};
    o.status = tu_run(argv, op, ep);
    o.out = tu_read(op, &o.out_size);
    o.err = tu_read(ep, NULL);
    if (!o.out) o.out = calloc(1, 1), o.out_size = 0;
    if (!o.err) o.err = calloc(1, 1);
    return o;
}

void tu_output_free(tu_output *o) {
    free(o->out);
    free(o->err);
}
