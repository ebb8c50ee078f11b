/* supervise.c: the processes and the build directory of `dmc run` (supervise.h).
 *
 * Why SIGTERM when dmc dies: a dmc that is killed outright cannot ask anything, and
 * SIGTERM is what a user's stop asks of the trainer: stop at the next step boundary, write
 * the --checkpoint (--resume continues from it), write no --save (the steps are not what
 * was asked for). It must come once: a second signal ends the trainer at once, without its
 * checkpoint. So only the trainer (or mpirun, which passes it on to its ranks) gets it,
 * from the kernel (PR_SET_PDEATHSIG); the watchdog adds SIGKILL to the whole group only
 * when it has not ended within DM_STOP_GRACE_S seconds (a step or a checkpoint that long,
 * or a rank that hangs). A compiler has nothing to keep: its whole group (cc1, as, ld)
 * gets SIGTERM at once (its temporary files are in the build directory: toolchain.c).
 *
 * The watchdog holds one end of a socket whose other end only dmc holds (close-on-exec:
 * the programs dmc runs do not inherit it). Each program started writes its process group
 * into it before it executes; dmc writes 0 when that program has ended (before its pid can
 * name another group) and -1 when it is done. End of file with no -1 is a dmc that died. */
#include "supervise.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static volatile sig_atomic_t child_running, stop_signal_seen;
static volatile pid_t child_pid;

static void pass_on_signal(int sig) {
    stop_signal_seen = sig;
    if (child_running) kill(child_pid, sig);
}

void dm_pass_on_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pass_on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

int dm_stop_signal(void) { return stop_signal_seen; }

/* What the watchdog is told: group > 0, a program runs in that process group (term_group:
 * SIGTERM goes to the whole group); 0, none runs; -1, dmc is done. */
typedef struct watch_msg {
    int32_t group;
    int32_t term_group;
} watch_msg;

static int watch_fd = -1; /* dmc's end of the socket to the watchdog */
static pid_t watch_pid;

/* Async-signal-safe: also called in a child between fork and exec. */
static void tell_watchdog(int32_t group, int32_t term_group) {
    if (watch_fd < 0) return;
    watch_msg m = {group, term_group};
    /* a watchdog that is gone is no reason to stop: no SIGPIPE, and no error */
    (void)send(watch_fd, &m, sizeof m, MSG_NOSIGNAL);
}

/* In the child, before exec: its own process group, the watchdog told, and SIGTERM when
 * dmc dies; _exit when dmc has already died. */
static void child_setup(pid_t parent, dm_run_kind kind) {
    setpgid(0, 0);
    tell_watchdog((int32_t)getpid(), kind == DM_RUN_TOOL);
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM); /* dmc died before the prctl */
#else
    (void)parent;
#endif
}

int dm_run_process(char *const argv[], dm_run_kind kind) {
    fflush(stdout);
    fflush(stderr);
    /* the child's pid is known to the handler before any signal can be passed on */
    sigset_t stops, before;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_BLOCK, &stops, &before);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &before, NULL);
        return -1;
    }
    if (pid == 0) {
        child_setup(parent, kind);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        sigprocmask(SIG_SETMASK, &before, NULL);
        execvp(argv[0], argv);
        fprintf(stderr, "dmc: error: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    child_running = 1;
    sigprocmask(SIG_SETMASK, &before, NULL);
    /* ended, but not yet reaped: its pid names no other group while the watchdog is told */
    siginfo_t info;
    int waited, status = 0;
    while ((waited = waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT)) < 0 && errno == EINTR) {
    }
    tell_watchdog(0, 0);
    while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    child_running = 0;
    if (waited < 0) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) fprintf(stderr, "dmc: %s was killed by signal %d\n", argv[0], WTERMSIG(status));
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

int dm_make_dir(const char *given, char path[PATH_MAX]) {
    if (!given) {
        const char *base = getenv("TMPDIR");
        snprintf(path, PATH_MAX, "%s/dmc-run-XXXXXX", base && *base ? base : "/tmp");
        if (mkdtemp(path)) return 0;
        fprintf(stderr, "dmc: error: cannot create a temporary directory: %s\n", strerror(errno));
        return -1;
    }
    snprintf(path, PATH_MAX, "%s", given);
    if (dm_make_path(path) != 0) {
        fprintf(stderr, "dmc: error: cannot create directory %s: %s\n", given, strerror(errno));
        return -1;
    }
    return 0;
}

int dm_make_path(const char *path) {
    char partial[PATH_MAX];
    if (snprintf(partial, sizeof partial, "%s", path) >= (int)sizeof partial) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = partial + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(partial, 0777);
            *p = '/';
        }
    return mkdir(partial, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

int dm_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    int status = d ? 0 : -1;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub || dm_remove_tree(sub)) status = -1;
    }
    if (d) closedir(d);
    return rmdir(path) == 0 ? status : -1;
}

/* Whether a process of group g still runs. kill() counts zombies, which an init that does
 * not reap orphans keeps forever; on Linux /proc tells them apart. */
static int group_alive(pid_t g) {
    if (kill(-g, 0) != 0) return errno == EPERM;
#ifdef __linux__
    DIR *d = opendir("/proc");
    if (!d) return 1;
    int alive = 0;
    for (struct dirent *e; !alive && (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0])) continue;
        char path[300], buf[512], state;
        int ppid, pgrp;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *p = strrchr(buf, ')'); /* after the command's name, which may hold anything */
        if (p && sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == g && state != 'Z' && state != 'X')
            alive = 1;
    }
    closedir(d);
    return alive;
#else
    return 1;
#endif
}

/* Waits up to `seconds` for group g to end: 1 when it did. */
static int group_ended(pid_t g, int seconds) {
    struct timespec tick = {0, 20 * 1000 * 1000};
    for (int i = 0; i < seconds * 50; i++) {
        if (!group_alive(g)) return 1;
        nanosleep(&tick, NULL);
    }
    return !group_alive(g);
}

/* dmc died while group g ran: SIGTERM (to the group, or on Linux already to its leader by
 * PR_SET_PDEATHSIG), DM_STOP_GRACE_S seconds to end, then SIGKILL. */
static void stop_group(pid_t g, int term_group) {
    if (term_group) kill(-g, SIGTERM);
#ifndef __linux__
    else kill(g, SIGTERM);
#endif
    if (group_ended(g, DM_STOP_GRACE_S)) return;
    kill(-g, SIGKILL);
    group_ended(g, 5);
}

/* Reads a whole message: 1, or 0 at end of file (dmc is gone) or on an error. */
static int read_msg(int fd, watch_msg *m) {
    size_t got = 0;
    while (got < sizeof *m) {
        ssize_t n = read(fd, (char *)m + got, sizeof *m - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        got += (size_t)n;
    }
    return 1;
}

static void watchdog(int fd, const char *dir, int remove) {
    setpgid(0, 0); /* a signal to dmc's process group is not one to the watchdog */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        /* dmc's stdout (a pipe to a reader waiting for its end) is not held */
        dup2(null, 0);
        dup2(null, 1);
        if (null > 2) close(null);
    }
    watch_msg m, last = {0, 0};
    while (read_msg(fd, &m)) {
        if (m.group < 0) _exit(0);
        last = m;
    }
    if (last.group > 0) stop_group(last.group, last.term_group);
    if (remove) dm_remove_tree(dir);
    _exit(0);
}

int dm_watch_start(const char *dir, int remove) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        fprintf(stderr, "dmc: warning: no watchdog for %s: %s\n", dir, strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        watchdog(sv[1], dir, remove);
    }
    close(sv[1]);
    if (pid < 0) {
        fprintf(stderr, "dmc: warning: no watchdog for %s: %s\n", dir, strerror(errno));
        close(sv[0]);
        return -1;
    }
    watch_fd = sv[0];
    watch_pid = pid;
    return 0;
}

void dm_watch_end(void) {
    if (watch_fd < 0) return;
    tell_watchdog(-1, 0);
    close(watch_fd);
    watch_fd = -1;
    while (waitpid(watch_pid, NULL, 0) < 0 && errno == EINTR) {
    }
}
