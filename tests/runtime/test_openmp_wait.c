/* test_openmp_wait: the trainer's default OpenMP wait (dmrt_openmp_wait_default, called by
 * a constructor of the trainer's object, linked here), as libgomp itself reports it. The test runs itself as a child in a chosen environment with
 * OMP_DISPLAY_ENV=VERBOSE, which makes libgomp print its settings, GOMP_SPINCOUNT among
 * them, when it starts: once per program image. Without a setting the child runs itself
 * again and the second image's libgomp says DMRT_OPENMP_SPINCOUNT; with OMP_WAIT_POLICY or
 * GOMP_SPINCOUNT, or under valgrind (its preload library in LD_PRELOAD), there is one image
 * and libgomp's own value. Exit 77 where the runtime has no libgomp (clang's libomp prints
 * no GOMP_SPINCOUNT; the trainer leaves it alone). */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "dmrt.h"

/* The trainer's object is linked in (its constructor acts before main, with the process's
 * own arguments: after the exec the child is still the child). */
int (*const trainer_linked)(const dmrt_model *, int, char **) = dmrt_trainer_main;

/* The child: an OpenMP loop (libgomp at work). */
static int child(void) {
    float sum[4] = {0};
    DMRT_PARALLEL_FOR(2)
    for (int i = 0; i < 4; i++) sum[i] = (float)i;
    printf("child ran: %g\n", (double)(sum[0] + sum[1] + sum[2] + sum[3]));
    return 0;
}

typedef struct {
    int images;          /* libgomp's start-up reports: program images that ran */
    char spincount[32];  /* the last one's GOMP_SPINCOUNT */
    int ran;             /* the child's own line */
} report;

/* Runs this program as `child` with exactly the environment env (through the dynamic
 * loader `loader`, `loader self child`, where that is set); reads what it printed. */
static int run_child_by(const char *loader, const char *self, char *const env[], report *r) {
    memset(r, 0, sizeof *r);
    int out[2];
    if (pipe(out) != 0) return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, out[1], 2);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char *argv[] = {(char *)self, "child", NULL}, *by_loader[] = {(char *)loader, (char *)self, "child", NULL};
    pid_t pid;
    int spawned = posix_spawn(&pid, loader ? loader : self, &fa, NULL, loader ? by_loader : argv, env);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    if (spawned != 0) {
        close(out[0]);
        return -1;
    }
    FILE *f = fdopen(out[0], "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char value[32];
        if (strstr(line, "OPENMP DISPLAY ENVIRONMENT BEGIN")) r->images++;
        if (sscanf(line, " GOMP_SPINCOUNT = '%31[^']'", value) == 1) snprintf(r->spincount, sizeof r->spincount, "%s", value);
        if (strstr(line, "child ran: 6")) r->ran = 1;
    }
    if (f) fclose(f);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
    return 0;
}

static int run_child(const char *self, char *const env[], report *r) { return run_child_by(NULL, self, env, r); }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "child") == 0) return child();
#if defined(__clang__) || !defined(_OPENMP)
    printf("SKIP: a runtime built by clang (libomp) or without OpenMP leaves the wait as it is\n");
    return 77;
#endif
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        printf("SKIP: no /proc/self/exe\n");
        return 77;
    }
    self[n] = 0;
    int fails = 0;
    report r;

    char *unset[] = {"OMP_DISPLAY_ENV=VERBOSE", NULL};
    CHECK(run_child(self, unset, &r) == 0, "the child failed");
    if (r.images == 0 || !r.spincount[0]) {
        printf("SKIP: no GOMP_SPINCOUNT printed: the runtime is without OpenMP or on another OpenMP runtime than "
               "libgomp (clang's libomp), whose wait the trainer leaves as it is\n");
        return 77;
    }
    CHECK(r.ran, "the child's loop did not run");
    CHECK(r.images == 2, "%d program images, want 2 (the program run again with the setting)", r.images);
    CHECK(strcmp(r.spincount, DMRT_OPENMP_SPINCOUNT) == 0, "libgomp's GOMP_SPINCOUNT '%s', want '%s'", r.spincount,
          DMRT_OPENMP_SPINCOUNT);

    char *passive[] = {"OMP_DISPLAY_ENV=VERBOSE", "OMP_WAIT_POLICY=PASSIVE", NULL};
    CHECK(run_child(self, passive, &r) == 0, "the child failed");
    CHECK(r.ran && r.images == 1 && strcmp(r.spincount, "0") == 0,
          "OMP_WAIT_POLICY=PASSIVE: %d images, GOMP_SPINCOUNT '%s'; want 1 and '0'", r.images, r.spincount);

    char *count[] = {"OMP_DISPLAY_ENV=VERBOSE", "GOMP_SPINCOUNT=77", NULL};
    CHECK(run_child(self, count, &r) == 0, "the child failed");
    CHECK(r.ran && r.images == 1 && strcmp(r.spincount, "77") == 0,
          "GOMP_SPINCOUNT=77: %d images, GOMP_SPINCOUNT '%s'; want 1 and '77'", r.images, r.spincount);

    /* a preload library ld.so cannot find is ignored (with a warning): the name is what counts */
    char *valgrind[] = {"OMP_DISPLAY_ENV=VERBOSE", "LD_PRELOAD=/nonexistent/vgpreload_memcheck-amd64-linux.so", NULL};
    CHECK(run_child(self, valgrind, &r) == 0, "the child failed");
    CHECK(r.ran && r.images == 1 && strcmp(r.spincount, DMRT_OPENMP_SPINCOUNT) != 0,
          "under valgrind's preload: %d images, GOMP_SPINCOUNT '%s'; want 1 and libgomp's default", r.images,
          r.spincount);

    /* started by the dynamic loader (`ld.so PROG ARGS`): /proc/self/exe is the loader, which
     * run again with the program's arguments would take `child` for the program; no
     * exec then, the child runs once with libgomp's default */
    const char *loader = "/lib64/ld-linux-x86-64.so.2";
    if (access(loader, X_OK) == 0) {
        CHECK(run_child_by(loader, self, unset, &r) == 0, "the child started by %s failed", loader);
        CHECK(r.ran && r.images == 1, "started by %s: %d images, the child %s; want 1, and it ran", loader, r.images,
              r.ran ? "ran" : "did not run");
    } else {
        printf("no %s: the start by the loader is not checked\n", loader);
    }

    printf("%s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
