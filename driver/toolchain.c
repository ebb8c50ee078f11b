/* toolchain.c: building the generated code of `dmc run` and starting it (toolchain.h). */
#include "toolchain.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen.h"
#include "build_cache.h"
#include "supervise.h"

#ifndef DMC_OPENMP_FLAG
#define DMC_OPENMP_FLAG "" /* -fopenmp when the runtime was built with OpenMP */
#endif
#ifndef DMC_SANITIZE
#define DMC_SANITIZE ""   /* -fsanitize=... when dmc itself is sanitized */
#endif

/* The device toolkit meson found when dmc was built (CUDA's): its compiler, home, the
 * flags and architecture its runtime library was compiled with. A target whose toolchain
 * (codegen_toolchain_of) names a compiler of its own runs this one, or $<compiler_env>. */
#ifndef DMC_NVCC
#define DMC_NVCC ""       /* the toolkit's compiler found when dmc was built, or "" */
#endif
#ifndef DMC_CUDA_HOME
#define DMC_CUDA_HOME "/usr/local/cuda"
#endif
#ifndef DMC_NVCC_FLAGS    /* as libdmrt_cuda is compiled (runtime/cuda/meson.build) */
#define DMC_NVCC_FLAGS "-std=c++17 -O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-ffp-contract=off"
#endif
#ifndef DMC_CUDA_ARCH
#define DMC_CUDA_ARCH "90"
#endif

/* The runtime to link generated code against: DMC_RUNTIME_DIR (a directory holding
 * dmrt.h, dmrt_comm.h, dmrt_cuda.h and the libdmrt*.a), the build tree dmc was built
 * in, or the install prefix. Headers in inc[0..2], libraries in lib[0..2] (runtime,
 * comm, cuda; repeats are harmless). */
static void runtime_paths(char inc[3][PATH_MAX], char lib[3][PATH_MAX]) {
    const char *env = getenv("DMC_RUNTIME_DIR");
    if (env && *env) {
        for (int i = 0; i < 3; i++) {
            snprintf(inc[i], PATH_MAX, "%s", env);
            snprintf(lib[i], PATH_MAX, "%s", env);
        }
        return;
    }
    if (access(DMC_BUILD_RUNTIME_DIR "/libdmrt.a", R_OK) == 0) {
        snprintf(inc[0], PATH_MAX, "%s", DMC_SOURCE_RUNTIME_DIR);
        snprintf(inc[1], PATH_MAX, "%s/comm", DMC_SOURCE_RUNTIME_DIR);
        snprintf(lib[0], PATH_MAX, "%s", DMC_BUILD_RUNTIME_DIR);
        snprintf(lib[1], PATH_MAX, "%s/comm", DMC_BUILD_RUNTIME_DIR);
        snprintf(inc[2], PATH_MAX, "%s/cuda", DMC_SOURCE_RUNTIME_DIR);
        snprintf(lib[2], PATH_MAX, "%s/cuda", DMC_BUILD_RUNTIME_DIR);
        return;
    }
    for (int i = 0; i < 3; i++) {
        snprintf(inc[i], PATH_MAX, "%s", DMC_INSTALL_INCLUDE_DIR);
        snprintf(lib[i], PATH_MAX, "%s", DMC_INSTALL_LIB_DIR);
    }
}

/* How many space-separated words s holds: what an argv must have room for. */
static int count_words(const char *s) {
    int n = 0;
    for (const char *c = s; *c; c++)
        if (*c != ' ' && (c == s || c[-1] == ' ')) n++;
    return n;
}

/* Appends the space-separated words of s (modified in place) to argv from index n,
 * up to index max (count_words sizes argv so that none is left out); returns the new
 * count. */
static int split_words(char *s, char **argv, int n, int max) {
    char *save = NULL;
    for (char *w = strtok_r(s, " ", &save); w && n < max; w = strtok_r(NULL, " ", &save)) argv[n++] = w;
    return n;
}

/* main.c of `dmc run`: the generic trainer of libdmrt; under MPI its ranks are this
 * process's one (dmrt_mpi_run). */
static const char main_marker[] = "/* main.c: written by dmc run";

/* Whether path may be (re)written as dmc run's main.c: absent, or one dmc run wrote
 * (`-o DIR` may name a folder that holds the user's own host program's main.c). */
static int main_ours(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT;
    char first[sizeof main_marker] = "";
    size_t n = fread(first, 1, sizeof main_marker - 1, f);
    fclose(f);
    return n == sizeof main_marker - 1 && memcmp(first, main_marker, n) == 0;
}

static int write_main(const char *path, const ir_graph *g, const dm_teacher_link *teacher, int mpi) {
    if (strcmp(g->model, "main") == 0 || (teacher && strcmp(teacher->model, "main") == 0)) {
        fprintf(stderr, "dmc: error: dmc run cannot build a model named 'main': its main.c is the trainer's "
                        "(name it otherwise with --name)\n");
        return -1;
    }
    if (!main_ours(path)) {
        fprintf(stderr, "dmc: error: %s is not one dmc run wrote: not overwritten (give dmc run another -o folder)\n",
                path);
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "dmc: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "%s: the generic trainer of libdmrt on model %s. */\n", main_marker, g->model);
    if (teacher) {
        /* two generated modules: their headers are not both included (each defines its
         * context's types), only their descriptors declared */
        fprintf(f, "#include \"dmrt.h\"\n\n");
        fprintf(f, "extern const dmrt_model %s_model, %s_model;\n\n", g->model, teacher->model);
        fprintf(f, "/* distillation: the teacher's forward feeds the student's input teacher_logits */\n");
        fprintf(f, "int main(int argc, char **argv) {\n");
        fprintf(f, "    static const dmrt_distill_layout layout = {.logits_output = %d, .parts = %lld, .data_axis = %d, "
                   ".microbatches = %d};\n", teacher->logits_output, teacher->parts, teacher->data_axis,
                teacher->microbatches);
        fprintf(f, "    return dmrt_distill_main(&%s_model, &%s_model, &layout, argc, argv);\n", g->model, teacher->model);
        fprintf(f, "}\n");
    } else if (!mpi) {
        fprintf(f, "#include \"%s.h\"\n", g->model);
        fprintf(f, "\nint main(int argc, char **argv) { return dmrt_trainer_main(&%s_model, argc, argv); }\n", g->model);
    } else {
        fprintf(f, "#include \"%s.h\"\n", g->model);
        fprintf(f, "#include \"dmrt_comm.h\"\n\n");
        fprintf(f, "struct args { int *argc; char ***argv; };\n\n");
        fprintf(f, "/* One rank per process: mpirun decides how many. */\n");
        fprintf(f, "static int mpi_launch(void *launch_arg, int n_ranks, dmrt_rank_main rank_main, void *arg, char *err, size_t errlen) {\n");
        fprintf(f, "    struct args *a = launch_arg;\n");
        fprintf(f, "    (void)n_ranks;\n");
        fprintf(f, "    return dmrt_mpi_run(a->argc, a->argv, rank_main, arg, err, errlen);\n");
        fprintf(f, "}\n\n");
        fprintf(f, "int main(int argc, char **argv) {\n");
        fprintf(f, "    struct args a = {&argc, &argv};\n");
        fprintf(f, "    return dmrt_trainer_main_spmd(&%s_model, argc, argv, mpi_launch, &a);\n", g->model);
        fprintf(f, "}\n");
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "dmc: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* The target's own compiler (nvcc): $<compiler_env> ($NVCC), or the one found when dmc was
 * built; NULL (with a message) when there is none to run. */
static const char *find_compiler(const char *target, const codegen_toolchain *tc) {
    const char *path = getenv(tc->compiler_env);
    if (!path || !*path) path = DMC_NVCC;
    if (*path && access(path, X_OK) == 0) return path;
    fprintf(stderr, "dmc: error: --target %s needs %s, the %s toolkit's compiler: %s (set %s to its path)\n", target,
            tc->compiler, tc->toolkit, *path ? "it is not executable here" : "none was found when dmc was built",
            tc->compiler_env);
    return NULL;
}

/* Runs a compiler with its temporary files in the build directory dir: a compiler that a
 * killed dmc leaves (nvcc keeps its tmpxft_* files on SIGTERM) leaves them where the
 * watchdog removes them (supervise.h). The trainer gets $TMPDIR as it was. */
static int run_compiler(char *const argv[], const char *dir) {
    const char *was = getenv("TMPDIR");
    char *saved = was ? strdup(was) : NULL;
    setenv("TMPDIR", dir, 1);
    int status = dm_run_process(argv, DM_RUN_TOOL);
    if (saved) setenv("TMPDIR", saved, 1);
    else unsetenv("TMPDIR");
    free(saved);
    return status;
}

/* The command compiling a generated source (.cu) into an object with the target's compiler
 * (nvcc) as the toolkit's runtime library libdmrt_cuda is compiled (DMC_NVCC_FLAGS: C++,
 * which the CUDA dialect's C also is; warnings as errors), for the architecture
 * $DMC_CUDA_ARCH or the build's (sm_90: H100, H200) with PTX for newer GPUs. */
typedef struct device_command {
    char gencode[2][96];
    char flags[sizeof DMC_NVCC_FLAGS];
    char *argv[40];
} device_command;

static void make_device_command(device_command *cmd, const char *nvcc, const char *source, const char *object,
                                char inc_flag[3][PATH_MAX + 2], const char *out_inc_flag) {
    const char *arch = getenv("DMC_CUDA_ARCH");
    if (!arch || !*arch) arch = DMC_CUDA_ARCH;
    snprintf(cmd->flags, sizeof cmd->flags, "%s", DMC_NVCC_FLAGS);
    snprintf(cmd->gencode[0], sizeof cmd->gencode[0], "arch=compute_%s,code=sm_%s", arch, arch);
    snprintf(cmd->gencode[1], sizeof cmd->gencode[1], "arch=compute_%s,code=compute_%s", arch, arch);
    int n = 0;
    cmd->argv[n++] = (char *)nvcc;
    cmd->argv[n++] = "-c";
    n = split_words(cmd->flags, cmd->argv, n, 24);
    char *rest[] = {"-gencode", cmd->gencode[0], "-gencode", cmd->gencode[1], inc_flag[0], inc_flag[1], inc_flag[2],
                    (char *)out_inc_flag, (char *)source, "-o", (char *)object};
    for (size_t k = 0; k < sizeof rest / sizeof *rest; k++) cmd->argv[n++] = rest[k];
    cmd->argv[n] = NULL;
}

/* dir/name+ext into path: 0, or -1 after a message when it is too long. */
static int in_dir(char path[PATH_MAX], const char *dir, const char *name, const char *ext) {
    if (snprintf(path, PATH_MAX, "%s/%s%s", dir, name, ext) < PATH_MAX) return 0;
    fprintf(stderr, "dmc: error: the path %s/%s%s is too long\n", dir, name, ext);
    return -1;
}

/* The C compiler: --cc, mpicc for --backend mpi, else $CC, else the one that built dmc. */
static const char *c_compiler(const dm_options *o, int mpi) {
    /* mpicc wraps the C compiler with MPI's flags; it must wrap the compiler that built the
     * runtime (its OpenMP and sanitizer runtimes: clang's libomp is not gcc's libgomp), so
     * Open MPI's and MPICH's wrappers are pointed at it unless the user chose otherwise */
    if (mpi && !o->cc) {
        setenv("OMPI_CC", DMC_DEFAULT_CC, 0);
        setenv("MPICH_CC", DMC_DEFAULT_CC, 0);
    }
    const char *cc = o->cc ? o->cc : mpi ? "mpicc" : getenv("CC");
    return cc && *cc ? cc : DMC_DEFAULT_CC;
}

/* The C compiler's flags, malloc'd: -march=native unless --march says otherwise;
 * $DMC_CFLAGS last, so that its flags win, however long. NULL when out of memory. */
static char *c_flags(const dm_options *o) {
    static const char form[] = "-std=c11 -O3 -march=%s -fno-math-errno %s %s %s";
    const char *march = o->march ? o->march : "native", *extra = getenv("DMC_CFLAGS");
    if (!extra) extra = "";
    int len = snprintf(NULL, 0, form, march, DMC_OPENMP_FLAG, DMC_SANITIZE, extra);
    char *flags = len < 0 ? NULL : malloc((size_t)len + 1);
    if (flags) snprintf(flags, (size_t)len + 1, form, march, DMC_OPENMP_FLAG, DMC_SANITIZE, extra);
    return flags;
}

static int uses_mpi(const dm_options *o) { return o->backend && strcmp(o->backend, "mpi") == 0; }

/* The command building the program exe: the C compiler (c_compiler) with c_flags, the
 * generated code (or its objects), main.c, libdmrt and the target's libraries. A malloc'd
 * argv whose words live in *storage (free both), or NULL when out of memory. */
static char **make_c_command(const dm_options *o, const codegen_toolchain *tc, int mpi, char inc_flag[3][PATH_MAX + 2],
                             char lib_flag[3][PATH_MAX + 2], const char *out_inc_flag, const char *const inputs[3],
                             const char *exe, char **storage) {
    const char *cc = c_compiler(o, mpi);
    char *flags = c_flags(o);
    static const char link_words[] = "-ldmrt -ldmrt_comm " DMC_LINK_FLAGS " -lm -lpthread";
    /* the target's libraries, after the toolkit's lib64 where they are there */
    char target_link[1024];
    snprintf(target_link, sizeof target_link, "%s%s", tc->toolkit_libs ? "-L" DMC_CUDA_HOME "/lib64 -Wl,-rpath," DMC_CUDA_HOME "/lib64 " : "",
             tc->libraries);
    /* the words of flags, the target's libraries and link_words, each NUL-ended, in one block */
    size_t flags_len = flags ? strlen(flags) + 1 : 0, target_len = strlen(target_link) + 1;
    char *words = flags ? malloc(flags_len + target_len + sizeof link_words) : NULL;
    /* every word of $DMC_CFLAGS, however many; 16: the compiler, paths and -o exe */
    int most = flags ? count_words(flags) + count_words(target_link) + count_words(link_words) + 16 : 0;
    char **argv = words ? calloc((size_t)most + 1, sizeof *argv) : NULL;
    if (!argv) {
        free(words);
        free(flags);
        return NULL;
    }
    memcpy(words, flags, flags_len);
    memcpy(words + flags_len, target_link, target_len);
    memcpy(words + flags_len + target_len, link_words, sizeof link_words);
    free(flags);
    int n = 0;
    argv[n++] = (char *)cc;
    n = split_words(words, argv, n, most);
    argv[n++] = inc_flag[0];
    argv[n++] = inc_flag[1];
    argv[n++] = (char *)out_inc_flag;
    for (int i = 0; i < 3; i++)
        if (inputs[i]) argv[n++] = (char *)inputs[i];
    for (int i = 0; i < 3; i++) argv[n++] = lib_flag[i];
    n = split_words(words + flags_len, argv, n, most);
    if (mpi) argv[n++] = "-ldmrt_comm_mpi";
    n = split_words(words + flags_len + target_len, argv, n, most);
    argv[n++] = "-o";
    argv[n++] = (char *)exe;
    argv[n] = NULL;
    *storage = words;
    return argv;
}

/* One compiler command: 0, 1 when it failed, or 128 + the signal that stopped dmc run. */
static int run_step(char *const argv[], const char *dir) {
    int status = dm_stop_signal() ? -1 : run_compiler(argv, dir);
    if (status < 0 && dm_stop_signal()) return 128 + dm_stop_signal();
    return status != 0;
}

/* Runs the build's commands: the device compiles (device[0..n_device)), then the C
 * compiler's cc_argv. 0, 1 after a message, or 128 + the signal that stopped dmc run. */
static int run_build(const codegen_toolchain *tc, device_command *device, int n_device, char **cc_argv, int mpi,
                     const char *dir) {
    for (int i = 0; i < n_device; i++) {
        int status = run_step(device[i].argv, dir);
        if (status == 1)
            fprintf(stderr, "dmc: error: compiling the generated %s failed (%s)\n", tc->toolkit, device[i].argv[0]);
        if (status != 0) return status;
    }
    int status = run_step(cc_argv, dir);
    if (status == 1) {
        fprintf(stderr, "dmc: error: building the generated code failed (%s%s)\n", cc_argv[0],
                mpi ? "; --backend mpi needs Open MPI's mpicc and the runtime's libdmrt_comm_mpi.a" : "");
    }
    return status;
}

int dm_build(const dm_options *o, const ir_graph *g, const dm_teacher_link *teacher, const char *dir,
             char exe[PATH_MAX]) {
    int mpi = uses_mpi(o);
    const char *target = o->codegen.target ? o->codegen.target : "c";
    const codegen_toolchain *tc = codegen_toolchain_of(target);
    char source_ext[16];
    snprintf(source_ext, sizeof source_ext, ".%s", codegen_source_suffix(target));
    /* model_c: what the C compiler links, the generated source or its object */
    char main_path[PATH_MAX], model_c[PATH_MAX], teacher_c[PATH_MAX] = "", inc[3][PATH_MAX], lib[3][PATH_MAX], inc_flag[3][PATH_MAX + 2],
        lib_flag[3][PATH_MAX + 2], out_inc_flag[PATH_MAX + 2];
    if (in_dir(main_path, dir, "main", ".c") || in_dir(exe, dir, g->model, "") ||
        in_dir(model_c, dir, g->model, tc->compiler ? ".o" : source_ext) ||
        (teacher && in_dir(teacher_c, dir, teacher->model, tc->compiler ? ".o" : source_ext)) ||
        write_main(main_path, g, teacher, mpi))
        return 1;
    runtime_paths(inc, lib);
    for (int i = 0; i < 3; i++) {
        snprintf(inc_flag[i], sizeof inc_flag[i], "-I%s", inc[i]);
        snprintf(lib_flag[i], sizeof lib_flag[i], "-L%s", lib[i]);
    }
    snprintf(out_inc_flag, sizeof out_inc_flag, "-I%s", dir);
    /* the target's own compiles (nvcc): the model's source and distillation's teacher's
     * (their paths here: the commands point at them until they have run) */
    device_command device[2];
    int n_device = 0;
    char source[PATH_MAX], teacher_source[PATH_MAX];
    if (tc->compiler) {
        const char *compiler = find_compiler(target, tc);
        if (!compiler || in_dir(source, dir, g->model, source_ext) ||
            (teacher && in_dir(teacher_source, dir, teacher->model, source_ext)))
            return 1;
        make_device_command(&device[n_device++], compiler, source, model_c, inc_flag, out_inc_flag);
        if (teacher) make_device_command(&device[n_device++], compiler, teacher_source, teacher_c, inc_flag, out_inc_flag);
    }
    const char *inputs[3] = {model_c, teacher ? teacher_c : NULL, main_path};
    char *words = NULL, **cc_argv = make_c_command(o, tc, mpi, inc_flag, lib_flag, out_inc_flag, inputs, exe, &words);
    dm_build_cache cache;
    const char *inc_dirs[3] = {inc[0], inc[1], inc[2]}, *lib_dirs[3] = {lib[0], lib[1], lib[2]};
    if (!cc_argv || dm_build_cache_begin(&cache, dir, inc_dirs, 3, lib_dirs, 3) != 0) {
        free(cc_argv);
        free(words);
        fprintf(stderr, "dmc: error: out of memory\n");
        return 1;
    }
    for (int i = 0; i < n_device; i++) dm_build_cache_add_command(&cache, device[i].argv);
    dm_build_cache_add_command(&cache, cc_argv);
    int status = 0;
    if (!dm_build_cache_fetch(&cache, exe)) {
        status = run_build(tc, device, n_device, cc_argv, mpi, dir);
        if (status == 0) dm_build_cache_store(&cache, exe);
    }
    dm_build_cache_end(&cache);
    free(cc_argv);
    free(words);
    return status;
}

int dm_run_trainer(const dm_options *o, const ir_graph *g, const char *exe) {
    /* mpirun [its args] -np N [--oversubscribe --allow-run-as-root] exe args: every word of
     * --mpirun, however long (a launch across machines has many: hosts, --mca settings) */
    char np[32];
    char *mpirun = strdup(o->mpirun ? o->mpirun : "mpirun");
    if (!mpirun) return 1;
    int mpirun_words = count_words(mpirun);
    /* the mesh's ranks, then the parameter servers' */
    snprintf(np, sizeof np, "%lld", (long long)ir_mesh_ranks(g) + g->param_servers.servers);
    char **argv = calloc((size_t)o->n_trainer_args + (size_t)mpirun_words + 16, sizeof(char *));
    if (!argv) {
        free(mpirun);
        return 1;
    }
    int n = 0;
    if (uses_mpi(o)) {
        n = split_words(mpirun, argv, 0, mpirun_words);
        argv[n++] = "-np";
        argv[n++] = np;
        if (!o->mpirun) {
            /* more ranks than cores is what a test on one machine wants; root is what CI is */
            argv[n++] = "--oversubscribe";
            if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
        }
    }
    argv[n++] = (char *)exe;
    if (o->teacher) {
        /* runtime/distill.c takes the teacher's weights first */
        argv[n++] = "--teacher-init";
        argv[n++] = (char *)o->teacher_init;
    }
    if (o->compacted_init) {
        argv[n++] = "--init";
        argv[n++] = (char *)o->compacted_init;
    }
    for (int i = 0; i < o->n_trainer_args; i++) argv[n++] = o->trainer_args[i];
    argv[n] = NULL;
    int status = dm_stop_signal() ? 128 + dm_stop_signal() : dm_run_process(argv, DM_RUN_TRAINER);
    free(argv);
    free(mpirun);
    return status;
}
