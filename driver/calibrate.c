/* calibrate.c: `dmc calibrate [-o FILE] [--backend threads|mpi] [--ranks N] [--quick]`.
 * The measurements are a program of their own, linked with libdmrt as generated code is
 * (dmc-calibrate; dmc-calibrate-mpi for the MPI backend, started by mpirun), so that they
 * time the runtime's own sgemm and communicators; dmc checks the options, finds the
 * program and becomes it. */
#include "calibrate.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DMC_BUILD_RUNTIME_DIR
#define DMC_BUILD_RUNTIME_DIR "."
#endif
#ifndef DMC_INSTALL_LIBEXEC_DIR
#define DMC_INSTALL_LIBEXEC_DIR "/usr/local/libexec"
#endif

static const char usage[] =
    "usage: dmc calibrate [-o FILE] [--backend threads|mpi] [--ranks N] [--quick]\n"
    "  measures this machine (matrix products, memory, elementwise kernels, links between\n"
    "  ranks) and writes a hardware description for --hardware FILE (docs/calibrate.md);\n"
    "  about 5 s on 2 cores, progress on standard error\n"
    "  -o FILE                 write it to FILE (default: standard output)\n"
    "  --backend threads|mpi   the communicator links are measured with (default threads;\n"
    "                          mpi runs dmc-calibrate-mpi under mpirun)\n"
    "  --ranks N               ranks of the link measurements (default 2)\n"
    "  --mpirun 'COMMAND ARGS' with --backend mpi: the launcher (default mpirun)\n"
    "  --quick                 fewer sizes, shorter runs: about a second, for tests\n";

/* The program named name: in the build tree dmc was built in (as `dmc run` prefers the
 * runtime there), in the install's libexec, or beside dmc itself. */
static int find_program(const char *name, char *path, size_t size) {
    char self[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) *slash = 0;
    }
    const char *dirs[] = {DMC_BUILD_RUNTIME_DIR, DMC_INSTALL_LIBEXEC_DIR, self};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!*dirs[i]) continue;
        snprintf(path, size, "%s/%s", dirs[i], name);
        if (access(path, X_OK) == 0) return 0;
    }
    return -1;
}

/* Appends the space-separated words of s (modified in place) to argv from index n, up to
 * index max; returns the new count. */
static int split_words(char *s, char **argv, int n, int max) {
    char *save = NULL;
    for (char *w = strtok_r(s, " ", &save); w && n < max; w = strtok_r(NULL, " ", &save)) argv[n++] = w;
    return n;
}

int dm_calibrate_main(int argc, char **argv) {
    const char *out = NULL, *backend = "threads", *ranks = NULL, *mpirun = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = strcmp(a, "-o") == 0 ? &out
                          : strcmp(a, "--backend") == 0 ? &backend
                          : strcmp(a, "--ranks") == 0 ? &ranks
                          : strcmp(a, "--mpirun") == 0 ? &mpirun : NULL;
        if (slot) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dmc: error: calibrate: %s needs a value\n%s", a, usage);
                return 2;
            }
            *slot = argv[++i];
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "dmc: error: calibrate: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    int mpi = strcmp(backend, "mpi") == 0;
    if (!mpi && strcmp(backend, "threads") != 0) {
        fprintf(stderr, "dmc: error: calibrate: --backend takes threads or mpi, got '%s'\n", backend);
        return 2;
    }
    if (mpirun && !mpi) {
        fprintf(stderr, "dmc: error: calibrate: --mpirun needs --backend mpi\n");
        return 2;
    }
    if (ranks) {
        char *end;
        long n = strtol(ranks, &end, 10);
        if (*end || end == ranks || n < 2 || n > 1024) {
            fprintf(stderr, "dmc: error: calibrate: --ranks takes an integer from 2 to 1024, got '%s'\n", ranks);
            return 2;
        }
    }
    const char *name = mpi ? "dmc-calibrate-mpi" : "dmc-calibrate";
    char program[PATH_MAX + 64];
    if (find_program(name, program, sizeof program)) {
        fprintf(stderr, "dmc: error: calibrate: cannot find %s (looked in %s and %s, and beside dmc)%s\n", name,
                DMC_BUILD_RUNTIME_DIR, DMC_INSTALL_LIBEXEC_DIR,
                mpi ? "; it is built only when MPI was found at configure time" : "");
        return 1;
    }

    /* [mpirun [its words] -np N [--oversubscribe --allow-run-as-root]] program options */
    char launcher[1024];
    snprintf(launcher, sizeof launcher, "%s", mpirun ? mpirun : "mpirun");
    char *args[64];
    int n = 0;
    if (mpi) {
        n = split_words(launcher, args, 0, 40);
        args[n++] = "-np";
        args[n++] = (char *)(ranks ? ranks : "2");
        if (!mpirun) {
            /* more ranks than cores is allowed on one machine; root is what CI runs as */
            args[n++] = "--oversubscribe";
            if (geteuid() == 0) args[n++] = "--allow-run-as-root";
        }
    }
    args[n++] = program;
    args[n++] = "--backend";
    args[n++] = (char *)backend;
    if (out) {
        args[n++] = "-o";
        args[n++] = (char *)out;
    }
    if (ranks) {
        args[n++] = "--ranks";
        args[n++] = (char *)ranks;
    }
    if (quick) args[n++] = "--quick";
    args[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    execvp(args[0], args);
    fprintf(stderr, "dmc: error: calibrate: cannot run %s: %s\n", args[0], strerror(errno));
    return 1;
}
