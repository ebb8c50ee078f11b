/* cores.c: how many threads each rank's loops and matrix products run on.
 *
 * The ranks running on one machine share its cores: each gets cores / ranks (at least
 * one), so that N rank threads of one process, or N MPI processes on one node, never ask
 * for more threads than there are cores. DMC_THREADS (and the trainer's --threads, which
 * sets the context's count after create) overrides it. */
#define _GNU_SOURCE
#include "dmrt.h"
#include "dmrt_comm.h"

#include <errno.h>
#include <link.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

int dmrt_cores(void) {
#ifdef CPU_COUNT
    /* taskset, cgroups' cpusets and mpirun's binding narrow it below the machine's */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online < 1 ? 1 : online > 4096 ? 4096 : (int)online;
}

int dmrt_threads_from_env(void) {
    const char *s = getenv("DMC_THREADS");
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > DMRT_MAX_THREADS) return -1;
    return (int)v;
}

int dmrt_threads_per_rank(int ranks_here) {
    int env = dmrt_threads_from_env();
    if (env > 0) return env;
    int cores = dmrt_cores();
    if (ranks_here < 1) ranks_here = 1;
    return cores / ranks_here < 1 ? 1 : cores / ranks_here;
}

int dmrt_threads_beside(const dmrt_rank *rank) { return dmrt_threads_per_rank(rank ? dmrt_rank_local_count(rank) : 1); }

/* Whether the program was started by running the dynamic loader itself (`ld.so PROG ARGS`,
 * as --library-path and other glibcs are used): then /proc/self/exe is the loader, and the
 * arguments the program sees are not the ones that would run it again. The kernel gave the
 * loader no base of its own (AT_BASE 0, the loader being the program it ran) though the
 * program asks for one (a PT_INTERP header, which static programs have not). */
#if defined(_OPENMP) && !defined(__clang__)
static int started_by_loader(void) {
    if (getauxval(AT_BASE) != 0) return 0;
    const ElfW(Phdr) *headers = (const ElfW(Phdr) *)getauxval(AT_PHDR);
    for (unsigned long i = 0, n = getauxval(AT_PHNUM); headers && i < n; i++)
        if (headers[i].p_type == PT_INTERP) return 1;
    return 0;
}
#endif

/* libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, in its constructor, before main
 * and after libc's own start-up has reset the environment to the one the process was given
 * (a setenv in a preinit function is lost): a process can only choose for itself by running
 * itself again with the setting in its environment. valgrind's client would leave valgrind
 * on that exec (its preload library in LD_PRELOAD says it is there): no exec then. Only for
 * libgomp (gcc's -fopenmp): clang's libomp has other settings (KMP_BLOCKTIME). */
void dmrt_openmp_wait_default(char **argv) {
#if !defined(_OPENMP) || defined(__clang__)
    (void)argv; /* no OpenMP, or clang's libomp: its KMP_BLOCKTIME is left as it is */
#else
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || !argv || !argv[0]) return;
    const char *preload = getenv("LD_PRELOAD");
    if ((preload && strstr(preload, "vgpreload")) || started_by_loader()) return;
    if (setenv("GOMP_SPINCOUNT", DMRT_OPENMP_SPINCOUNT, 0) != 0) return;
    execv("/proc/self/exe", argv);
    /* no /proc, or the program file is gone: go on with libgomp's default, and leave the
     * setting to no child either */
    unsetenv("GOMP_SPINCOUNT");
#endif
}
