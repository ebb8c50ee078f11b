/* supervise.h: the processes and the build directory of `dmc run` (docs/trainer.md,
 * "Stopping").
 *
 * dmc run starts the C compiler (nvcc, cc or mpicc), then the trainer (or mpirun), each
 * in a process group of its own, and passes SIGINT, SIGTERM and SIGHUP on to it: a
 * terminal's Ctrl-C reaches the trainer once, through dmc, and asks it to stop at a step
 * boundary. Nothing outlives dmc for long, however dmc ends:
 *   - every program it starts gets SIGTERM when dmc dies (Linux: PR_SET_PDEATHSIG): the
 *     trainer stops at a step boundary, writes its --checkpoint and no --save; mpirun
 *     passes SIGTERM on to the ranks;
 *   - a watchdog process, started with the build directory, learns from dmc which process
 *     group runs; when dmc is gone without saying it is done (SIGKILL, a crash), it sends
 *     SIGTERM to a compiler's whole group, waits up to DM_STOP_GRACE_S seconds for the
 *     group to end, kills what is left with SIGKILL, then removes the temporary build
 *     directory (never a --keep or -o one). */
#ifndef DMC_SUPERVISE_H
#define DMC_SUPERVISE_H

#include <limits.h>

/* How long the watchdog lets the programs of a killed dmc stop on their own. */
#define DM_STOP_GRACE_S 30

/* A program dmc runs: a tool (a compiler: the watchdog signals its whole group) or the
 * trainer (itself or mpirun: only it gets SIGTERM, once, to stop at a step boundary). */
typedef enum dm_run_kind { DM_RUN_TOOL, DM_RUN_TRAINER } dm_run_kind;

/* From here on SIGINT, SIGTERM and SIGHUP are passed on to the program running. */
void dm_pass_on_signals(void);
/* The signal passed on (the last one), 0 when none came. */
int dm_stop_signal(void);

/* Runs argv (argv[0] looked up in PATH) in a process group of its own and waits for it:
 * its exit status, 128 + the signal that killed it (said on stderr), 127 when it cannot
 * be run, -1 when no process could be started. */
int dm_run_process(char *const argv[], dm_run_kind kind);

/* The directory to write into: `given` (created with its parents), or with NULL a new
 * $TMPDIR/dmc-run-XXXXXX (/tmp without TMPDIR), its path in `path`. 0, or -1 after a
 * message. */
int dm_make_dir(const char *given, char path[PATH_MAX]);
/* mkdir -p path, quietly: 0 (also when it exists), or -1 with errno set. */
int dm_make_path(const char *path);
/* Removes a file or a directory with everything in it: 0, or -1. */
int dm_remove_tree(const char *path);

/* Starts the watchdog of dir (removed when dmc dies with remove set). 0, or -1 (with a
 * warning: dmc runs on without). */
int dm_watch_start(const char *dir, int remove);
/* dmc is done (it removed a temporary directory itself): the watchdog exits and is
 * waited for. */
void dm_watch_end(void);

#endif
