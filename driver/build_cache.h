/* build_cache.h: dmc run's cache of built programs. Building the generated code is most of
 * a short `dmc run` (seconds to a minute: cc at -O3, nvcc), and a run that differs from an
 * earlier one only in the trainer's options (--steps, --resume, --data, --threads) builds
 * the same program again. The cache keeps each program built, under a key (SHA-256) of
 * everything the build reads: the files dmc wrote (sources, headers), the compiler commands
 * (the build directory's path left out), the compilers themselves (path, size, time),
 * the environment variables compilers read, libdmrt's installed headers (their bytes) and
 * libraries (path, size, time of change) and the CPU (-march=native). A later build with the same key copies the program
 * instead of compiling it. Only programs that built are kept; a failed build always runs.
 *
 * Where: $DMC_BUILD_CACHE (a directory, or "off"), else $XDG_CACHE_HOME/dmc/builds, else
 * $HOME/.cache/dmc/builds; at most $DMC_BUILD_CACHE_MB MiB (default 1024), the least
 * recently used programs removed first. An entry is written under a temporary name and
 * renamed, so concurrent runs never see half a program. $DMC_BUILD_CACHE_LOG names a file
 * to which each build appends "hit|miss KEY PROGRAM". docs/trainer.md, "Build cache". */
#ifndef DMC_BUILD_CACHE_H
#define DMC_BUILD_CACHE_H

#include <limits.h>

typedef struct dm_build_cache {
    int enabled;               /* 0: no cache (off, or no directory to hold it) */
    char dir[PATH_MAX];        /* the cache directory */
    char entry[PATH_MAX];      /* dir/<key>: the program, once built */
    char build_dir[PATH_MAX];  /* the build's directory, left out of the key */
    void *hash;                /* the key so far (a dm_sha256) */
} dm_build_cache;

/* Starts the key of a build in build_dir: the cache's settings from the environment, the
 * CPU, and the runtime (the bytes of every dmrt*.h of the include directories, the size,
 * time of change and inode of every libdmrt* of the library directories). Returns 0, or -1
 * when out of memory (the cache then off). */
int dm_build_cache_begin(dm_build_cache *c, const char *build_dir, const char *const include_dirs[],
                         int n_include_dirs, const char *const lib_dirs[], int n_lib_dirs);
/* Adds a compiler command to the key: each word (the build directory's path replaced by a
 * placeholder), and the compiler (argv[0], found on $PATH): its path, size and time. */
void dm_build_cache_add_command(dm_build_cache *c, char *const argv[]);
/* Ends the key with the files of the build directory the compilers read (*.c, *.h, *.cu,
 * *.cuh: their names and bytes) and, if the cache holds that program, copies it to exe:
 * 1 when it did (no build needed), 0 when there is none (build, then _store). */
int dm_build_cache_fetch(dm_build_cache *c, const char *exe);
/* Keeps exe, just built, under the key; removes the least recently used programs past the
 * cache's size. A cache that cannot be written is left alone (a note on stderr once). */
void dm_build_cache_store(dm_build_cache *c, const char *exe);
void dm_build_cache_end(dm_build_cache *c);

#endif
