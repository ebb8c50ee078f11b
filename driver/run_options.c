/* run_options.c: dmc run's usage, and the trainer's options checked before compiling.
 *
 * dmc run passes every argument it does not take itself to the program it builds, whose
 * trainer (runtime/trainer.c) parses them. Checked only there, a typo would surface after
 * the C compile; checked here against the trainer's table, it is reported at once. */
#include "run_options.h"

#include <stdlib.h>
#include <string.h>

#include "trainer_options.h"

static const char run_usage[] =
    "usage: dmc run [options] FILE.dm [trainer options]\n"
    "       dmc run [options] FILE.dm [options] -- [trainer options]\n"
    "Compiles FILE.dm, builds it with cc (nvcc for --target cuda) against libdmrt and\n"
    "trains it: the program is the trainer of docs/trainer.md on the model. Options after\n"
    "FILE.dm are dmc's when it has them (--mesh, --set, ...), else the trainer's; after\n"
    "'--' every argument is the trainer's. Trainer options are checked before compiling.\n"
    "\n"
    "dmc run's own options (and every option of dmc --help: --set, --mesh, --target, ...):\n"
    "  --keep DIR         build in DIR and keep it (default: a temporary directory)\n"
    "  --cc COMPILER      the C compiler (default $CC, else the one dmc was built with)\n"
    "  --backend threads|mpi\n"
    "                     for a partitioned program (a mesh of several ranks): threads\n"
    "                     (the default) runs the ranks as threads of one process; mpi\n"
    "                     builds with mpicc and runs one process per rank under mpirun\n"
    "  --mpirun 'COMMAND ARGS'\n"
    "                     with --backend mpi: the launcher (default mpirun)\n"
    "  --march ISA        the instruction set the program is built for, as the compiler's\n"
    "                     -march (default native: this machine's CPU; x86-64 or x86-64-v2\n"
    "                     for a program that must also run on older CPUs, under valgrind,\n"
    "                     or on other hosts of an MPI run). $DMC_CFLAGS is appended to the\n"
    "                     compiler's flags last (its -march wins over --march)\n"
    "  --teacher TEACHER.dm\n"
    "                     knowledge distillation (docs/compression.md): the student FILE.dm\n"
    "                     trains on alpha * cross_entropy + (1 - alpha) * T^2 *\n"
    "                     KL(softmax(teacher / T) || softmax(logits / T)), the teacher's\n"
    "                     forward (a serial program with the student's inputs and a\n"
    "                     cross-entropy loss whose logits are an output) run in the same\n"
    "                     program on every step's batch; any mesh (each rank's teacher on\n"
    "                     its rank's device with --target cuda)\n"
    "  --teacher-init FILE\n"
    "                     with --teacher: the teacher's weights (safetensors; required)\n"
    "  --distill-temperature T\n"
    "                     with --teacher: the temperature T > 0 (default 4)\n"
    "  --distill-alpha A  with --teacher: the cross-entropy's weight A in [0, 1] (default 0.5)\n"
    "  With --target cuda each rank uses one GPU (DMRT_CUDA_DEVICE picks it); collectives go\n"
    "  through NCCL when every rank has a GPU of its own, else staged through host memory\n"
    "  (DMRT_GPU_COMM=nccl|staged forces one); NVCC and DMC_CUDA_ARCH (default 90) choose the\n"
    "  compiler and the GPU architecture. Under --precision bf16/fp16 the attention runs\n"
    "  through cuDNN, a shape cuDNN does not run on the f32 kernel with a line on stderr\n"
    "  (DMRT_CUDNN_ATTENTION=require fails instead, =off never uses cuDNN).\n"
    "  Built programs are kept in a cache and reused when a build would read the same files,\n"
    "  flags, compiler and runtime (docs/trainer.md, \"Build cache\"): DMC_BUILD_CACHE is its\n"
    "  directory (default $XDG_CACHE_HOME/dmc/builds, else ~/.cache/dmc/builds) or off,\n"
    "  DMC_BUILD_CACHE_MB its size in MiB (default 1024).\n"
    "\n"
    "trainer options (docs/trainer.md):\n";

void dm_run_usage(FILE *fp) {
    fputs(run_usage, fp);
    dmrt_trainer_options_print(fp);
    fputs("  -h, --help         print this text and exit\n", fp);
}

typedef struct trainer_option {
    const char *name;
    const char *value; /* NULL: a flag */
} trainer_option;

#define RUN_TRAINER_OPTION(name, value, help) {name, value},
static const trainer_option trainer_options[] = {DMRT_TRAINER_OPTIONS(RUN_TRAINER_OPTION)};
#undef RUN_TRAINER_OPTION
enum { N_TRAINER_OPTIONS = sizeof trainer_options / sizeof trainer_options[0] };

/* dmc's own options that dmc run takes after FILE.dm: only to suggest them for a typo
 * (dmc.c parses them). */
static const char *const dmc_options[] = {
    "--set", "--mesh", "--devices", "--global-batch", "--top", "--plan-whole", "--bucket-mb",
    "--target", "--tf32", "--microbatches", "--accumulate", "--hardware", "--precision", "--quantize", "--quantize-group",
    "--quantize-embeddings",
    "--loss-scale", "--loss-scale-interval", "--prune", "--prune-start", "--prune-end", "--memory-gb", "--recompute", "--zero", "--compress", "--grad-reduce", "--param-servers", "--ps-staleness", "--schedule", "--chunks", "--keep", "--cc", "--backend",
    "--mpirun", "--march", "--teacher", "--teacher-init", "--distill-temperature", "--distill-alpha"};

/* Edit distance of a[0..na) and b, a swap of two neighbours counting as one edit (the
 * optimal string alignment distance), for suggestions: names are short. */
static size_t edit_distance(const char *a, size_t na, const char *b) {
    size_t nb = strlen(b), d[64][64];
    if (na >= 64 || nb >= 64) return (size_t)-1;
    for (size_t i = 0; i <= na; i++) d[i][0] = i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[na][nb];
}

/* The option name closest to arg[0..n), trainer's or dmc's, when close enough to be
 * the one meant (at most 2 edits, fewer than a third of its length); else NULL. */
static const char *closest_option(const char *arg, size_t n) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (int k = 0; k < N_TRAINER_OPTIONS + (int)(sizeof dmc_options / sizeof *dmc_options); k++) {
        const char *name = k < N_TRAINER_OPTIONS ? trainer_options[k].name : dmc_options[k - N_TRAINER_OPTIONS];
        size_t d = edit_distance(arg, n, name);
        if (d < best_d) best_d = d, best = name;
    }
    return best && best_d <= 2 && best_d * 3 < strlen(best) ? best : NULL;
}

static const trainer_option *find_trainer_option(const char *arg, size_t n) {
    for (int k = 0; k < N_TRAINER_OPTIONS; k++)
        if (strlen(trainer_options[k].name) == n && strncmp(arg, trainer_options[k].name, n) == 0)
            return &trainer_options[k];
    return NULL;
}

int dm_run_trainer_arg(int argc, char **argv, int *i, char **args, int *n_args) {
    const char *arg = argv[*i];
    if (arg[0] != '-' || !arg[1]) {
        fprintf(stderr, "dmc: error: unexpected argument '%s': dmc run takes one FILE.dm, its options and the "
                        "trainer's (dmc run --help)\n", arg);
        return -1;
    }
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        /* the trainer's help is in dmc run's: no need to compile for it */
        dm_run_usage(stdout);
        exit(0);
    }
    size_t n = strcspn(arg, "=");
    const trainer_option *opt = find_trainer_option(arg, n);
    if (!opt) {
        const char *near = closest_option(arg, n);
        if (near && strlen(near) == n && strncmp(arg, near, n) == 0) {
            fprintf(stderr, "dmc: error: %s is dmc's option, not the trainer's: give it before '--'\n", near);
            return -1;
        }
        fprintf(stderr, "dmc: error: unknown option '%.*s'", (int)n, arg);
        if (near) fprintf(stderr, " (did you mean %s?)", near);
        fprintf(stderr, "; dmc run --help lists dmc run's options and the trainer's\n");
        return -1;
    }
    if (!opt->value && arg[n]) {
        fprintf(stderr, "dmc: error: trainer option %s takes no value, got '%s'\n", opt->name, arg);
        return -1;
    }
    args[(*n_args)++] = argv[*i];
    if (opt->value && !arg[n]) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "dmc: error: trainer option %s needs a value (%s %s)\n", opt->name, opt->name, opt->value);
            return -1;
        }
        args[(*n_args)++] = argv[++*i];
    }
    return 0;
}
