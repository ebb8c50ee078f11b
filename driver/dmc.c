/* dmc: the driver. A flat list of the passes (DESIGN.md), and `dmc run`, which builds
 * the generated code with the system C compiler and trains it. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ast.h"
#include "calibrate.h"
#include "codegen.h"
#include "compile.h"
#include "plan.h"
#include "run_options.h"
#include "explain.h"
#include "lower.h"
#include "hardware.h"
#include "passes.h"
#include "schedule.h"
#include "suggest.h"

#ifndef DMC_OPENMP_FLAG
#define DMC_OPENMP_FLAG "" /* -fopenmp when the runtime was built with OpenMP */
#endif
#ifndef DMC_SANITIZE
#define DMC_SANITIZE ""   /* -fsanitize=... when dmc itself is sanitized */
#endif

#ifndef DMC_NVCC
#define DMC_NVCC ""       /* nvcc found when dmc was built, or "" */
#endif
#ifndef DMC_CUDA_HOME
#define DMC_CUDA_HOME "/usr/local/cuda"
#endif
#ifndef DMC_NVCC_FLAGS    /* as libdmrt_cuda is compiled (runtime/cuda/meson.build) */
#define DMC_NVCC_FLAGS "-std=c++17 -O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror"
#endif
#ifndef DMC_CUDA_ARCH
#define DMC_CUDA_ARCH "90"
#endif

#ifndef DMC_VERSION
#define DMC_VERSION "0.1.0"
#endif

static const char usage[] =
    "usage: dmc [options] FILE.dm -o DIR     compile to DIR/<model>.h and DIR/<model>.c (.cu)\n"
    "       dmc --emit=ir [options] FILE.dm  print the IR\n"
    "       dmc --explain[=full|json] [options] FILE.dm\n"
    "                                        print the partition and memory plan: a screen at\n"
    "                                        any size (alike layers on one line, collectives\n"
    "                                        grouped); =full every parameter and collective;\n"
    "                                        =json everything, for tools\n"
    "       dmc --check [options] FILE.dm    report errors only\n"
    "       dmc --plan[=json] --devices N [options] FILE.dm\n"
    "                                        search meshes, micro-batches, schedules, ZeRO and\n"
    "                                        recomputation for N devices; print the fastest that fit\n"
    "       dmc run [options] FILE.dm [trainer options]\n"
    "                                        compile, build with cc and train (see dmc run --help)\n"
    "       dmc calibrate [-o FILE]          measure this machine for --hardware (dmc calibrate --help)\n"
    "\n"
    "options (every command):\n"
    "  --set NAME=N[,NAME=N...]   override dimension constants (dim NAME = ...)\n"
    "  --mesh AXIS=N[,AXIS=N...]  override mesh axis sizes (mesh(AXIS = ...))\n"
    "  --mesh auto                the best plan --plan finds for --devices N (it also chooses\n"
    "                             --microbatches, --schedule, --zero and --recompute)\n"
    "  --name PREFIX              symbol prefix of the generated code (default: file name)\n"
    "  --stop-after=PASS          with --emit=ir: stop after lower, autodiff, optimizer or shard\n"
    "  -o DIR                     output directory (created if missing)\n"
    "  --target c|cuda            generated code: C for CPUs (default), or CUDA with cuBLAS\n"
    "                             and NCCL for NVIDIA GPUs (dmc run compiles it with nvcc)\n"
    "  --tf32                     cuda: matrix products may use TF32 (default strict fp32)\n"
    "  --hardware NAME|FILE       the machine plans are timed on: a preset (nominal, the\n"
    "                             default; cpu-2core, a100-80gb-sxm, h100-80gb-sxm) or a JSON\n"
    "                             file (docs/cost.md); --hardware list prints the presets\n"
    "  --precision fp32|tf32|bf16 the precision matrix products are timed at (default fp32,\n"
    "                             tf32 with --tf32); bf16 is planning only: no code for it\n"
    "  --bucket-mb X              largest gradient bucket allreduced at once, in MiB (default\n"
    "                             25; the first, of the last layers, is at most 1)\n"
    "  --microbatches M           run each step's batch as M micro-batches, their gradients\n"
    "                             summed (schedule NAME(microbatches = M) in the .dm); with a\n"
    "                             mesh axis named pipeline, they flow through its stages\n"
    "  --accumulate K             the same count, by its other name (accumulate = K)\n"
    "  --schedule gpipe|1f1b|interleaved|2bw|pipedream\n"
    "                             the pipeline schedule (default gpipe); interleaved 1F1B\n"
    "                             cuts the model into pipeline x v virtual stages, each rank\n"
    "                             holding v of them (--chunks v), for 1/v of 1F1B's bubble;\n"
    "                             2bw (PipeDream-2BW, pipedream_2bw in the .dm) never flushes:\n"
    "                             batch t's gradient is taken on the weights one update old,\n"
    "                             two versions kept; pipedream (PipeDream's weight stashing)\n"
    "                             never flushes and updates a stage after every backward, each\n"
    "                             micro-batch's backward on the weights its forward used\n"
    "                             (docs/parallelism.md)\n"
    "  --chunks v                 with --schedule interleaved: model chunks per pipeline rank\n"
    "                             (schedule interleaved(..., chunks = v) in the .dm)\n"
    "  --memory-gb X              memory per rank the pipeline cut must fit (default: no limit)\n"
    "  --recompute MODE           activation recomputation: full (every layer call keeps only\n"
    "                             its inputs for the backward pass, which makes the rest\n"
    "                             again), selective (only cheap ops: not products), marked\n"
    "                             (default: the calls the .dm wraps in recompute(...)), off\n"
    "  --no-fuse-attention        keep softmax(causal_mask(q @ kT * s)) @ v as its three ops\n"
    "                             (the C target fuses it into one kernel that holds no T x T\n"
    "                             scores: docs/compiler.md)\n"
    "  --sequence-parallel        with a mesh axis named tensor: the layernorms, residual adds\n"
    "                             and dropouts between tensor-parallel products hold their\n"
    "                             rows split over tensor (the sequence of [B, T, C]), reduce-\n"
    "                             scatter and all-gather replacing each allreduce (Megatron-LM)\n"
    "  --zero 0|1|2|3             ZeRO: 1 splits the optimizer state over the axis gradients\n"
    "                             are allreduced on (data), 2 the gradients too, 3 the\n"
    "                             parameters too, gathered per bucket before use (zero = N in\n"
    "                             the .dm; default 0)\n"
    "  --compress MODE            gradient compression of the allreduces over the data axis\n"
    "                             (docs/parallelism.md): bf16 or fp16 (16-bit values on the\n"
    "                             wire), topk:RATIO (each rank sends that fraction of each\n"
    "                             gradient, its largest elements, with error feedback),\n"
    "                             powersgd:RANK (matrices as rank-RANK factors, with error\n"
    "                             feedback); none (default). C target, without ZeRO\n"
    "  --param-servers S          data parallelism through S parameter servers, world ranks\n"
    "                             after the mesh's: each holds a shard of the parameters and\n"
    "                             its optimizer state; workers push gradients and pull\n"
    "                             parameters (synchronous: the allreduce's result, bit for\n"
    "                             bit). A mesh of the data axis only, C target\n"
    "                             (docs/parallelism.md)\n"
    "  --ps-staleness K           with --param-servers: asynchronous, each push applied as it\n"
    "                             comes, no worker more than K steps ahead of the slowest\n"
    "  --help, --version\n"
    "\n"
    "--plan and --mesh auto: --devices N (required), --global-batch B (the inputs' leading\n"
    "  dim; default the program's), --memory-gb X (per device; default the hardware's),\n"
    "  --hardware, --precision, --top K (plans printed, default 5; 0 all), --plan-whole\n"
    "  (compile every plan whole instead of estimating deep models from two-layer probes)\n"
    "\n"
    "dmc run: dmc run --help lists its options (--keep, --cc, --backend, --mpirun) and the\n"
    "  trainer's (--steps, --epochs, --seed, --save, --data, ...: docs/trainer.md).\n";

typedef struct options {
    const char *input;
    const char *out_dir;
    const char *name;
    const char *emit;         /* "ir" or NULL */
    const char *stop_after;   /* lower | autodiff | optimizer | shard */
    int explain;              /* 0, or 1 + the explain_format */
    int plan;                 /* --plan: 0, 1 text, 2 json */
    int mesh_auto;            /* --mesh auto */
    int64_t devices;          /* --devices */
    int64_t global_batch;     /* --global-batch, 0: the program's */
    int top;                  /* --top, -1: 5 */
    int plan_whole;           /* --plan-whole */
    int check;
    int run;
    const char *keep_dir;
    const char *cc;
    const char *backend;      /* dmc run: "threads" (default) or "mpi" */
    const char *mpirun;       /* dmc run --backend mpi: the launcher command */
    codegen_options codegen;
    int64_t bucket_bytes;     /* --bucket-mb, in bytes (0: the default) */
    dm_override dims[64];
    int n_dims;
    dm_override mesh[IR_MAX_AXES];
    int n_mesh;
    int microbatches;         /* --microbatches / --accumulate, 0: the program's */
    int schedule;             /* --schedule, -1: the program's */
    int chunks;               /* --chunks, 0: the program's */
    int zero;                 /* --zero, -1: the program's */
    int recompute;            /* --recompute as an ir_recompute */
    int no_fuse_attention;    /* --no-fuse-attention */
    int sequence_parallel;    /* --sequence-parallel */
    ir_compress compress;     /* --compress */
    ir_param_servers param_servers; /* --param-servers, --ps-staleness (-1: synchronous) */
    dm_pipeline_options pipeline;
    dm_hardware hardware;     /* --hardware (pipeline.cost.hardware points here) */
    int precision;            /* --precision, -1: fp32, or tf32 with --tf32 */
    char **trainer_args;      /* passed through to the trainer */
    int n_trainer_args;
} options;

/* The largest gradient bucket in floats (0: the default; a size under one float: 1). */
static int64_t bucket_floats(const options *o) {
    return o->bucket_bytes / 4 > 0 ? o->bucket_bytes / 4 : o->bucket_bytes > 0 ? 1 : 0;
}

static int parse_overrides(const char *flag, const char *list, dm_override *out, int *n, int max) {
    char *copy = strdup(list), *save = NULL;
    int status = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        char *end = NULL;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == item || !end || *end || end == eq + 1) {
            fprintf(stderr, "dmc: error: %s expects NAME=INTEGER[,NAME=INTEGER...], got '%s'\n", flag, item);
            status = -1;
            break;
        }
        if (*n == max) {
            fprintf(stderr, "dmc: error: too many %s overrides\n", flag);
            status = -1;
            break;
        }
        *eq = 0;
        out[*n].name = strdup(item);
        out[*n].value = v;
        out[*n].used = 0;
        (*n)++;
    }
    free(copy);
    return status;
}

/* Options may be written --opt=value or --opt value. */
static const char *option_value(int argc, char **argv, int *i, const char *flag) {
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) == 0 && argv[*i][n] == '=') return argv[*i] + n + 1;
    if (strcmp(argv[*i], flag) == 0) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "dmc: error: %s needs a value\n", flag);
            exit(2);
        }
        return argv[++*i];
    }
    return NULL;
}

/* A positive number up to 1e6 of `unit` (MiB, GiB) into *out. */
static int parse_size(const char *flag, const char *v, const char *unit, double *out) {
    char *end = NULL;
    double x = strtod(v, &end);
    if (!end || *end || end == v || !(x > 0) || x > 1e6) {
        fprintf(stderr, "dmc: error: %s expects a positive number of %s, got '%s'\n", flag, unit, v);
        return -1;
    }
    *out = x;
    return 0;
}

/* An integer from lo to hi into *out: 1, or -1 with a message. */
static int parse_count(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    long long x = strtoll(v, &end, 10);
    if (!end || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "dmc: error: %s expects an integer from %lld to %lld, got '%s'\n", flag, (long long)lo,
                (long long)hi, v);
        return -1;
    }
    *out = x;
    return 1;
}

static int parse_microbatches(const char *flag, const char *v, options *o) {
    int64_t m;
    if (parse_count(flag, v, 1, 4096, &m) < 0) return -1;
    o->microbatches = (int)m;
    return 0;
}

/* The options of the compiler proper, also taken after the .dm file of `dmc run`:
 * 1 when argv[*i] was one, 0 when not, -1 on a bad value. */
static int parse_common(int argc, char **argv, int *i, options *o) {
    const char *v;
    if ((v = option_value(argc, argv, i, "--set")))
        return parse_overrides("--set", v, o->dims, &o->n_dims, 64) ? -1 : 1;
    if ((v = option_value(argc, argv, i, "--mesh"))) {
        if (strcmp(v, "auto") == 0) return o->mesh_auto = 1;
        return parse_overrides("--mesh", v, o->mesh, &o->n_mesh, IR_MAX_AXES) ? -1 : 1;
    }
    if ((v = option_value(argc, argv, i, "--devices"))) return parse_count("--devices", v, 1, 1 << 24, &o->devices);
    if ((v = option_value(argc, argv, i, "--global-batch")))
        return parse_count("--global-batch", v, 1, (int64_t)1 << 40, &o->global_batch);
    if ((v = option_value(argc, argv, i, "--top"))) {
        int64_t top;
        if (parse_count("--top", v, 0, 100000, &top) < 0) return -1;
        o->top = (int)top;
        return 1;
    }
    if (strcmp(argv[*i], "--plan-whole") == 0) return o->plan_whole = 1;
    if (strcmp(argv[*i], "--no-fuse-attention") == 0) return o->no_fuse_attention = 1;
    if (strcmp(argv[*i], "--sequence-parallel") == 0) return o->sequence_parallel = 1;
    double size;
    if ((v = option_value(argc, argv, i, "--bucket-mb"))) {
        if (parse_size("--bucket-mb", v, "MiB", &size)) return -1;
        o->bucket_bytes = (int64_t)(size * 1024 * 1024);
        o->pipeline.bucket_bytes = (double)o->bucket_bytes;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--target"))) {
        if (!codegen_target_known(v)) {
            fprintf(stderr, "dmc: error: --target takes c or cuda, got '%s'\n", v);
            return -1;
        }
        o->codegen.target = v;
        return 1;
    }
    if (strcmp(argv[*i], "--tf32") == 0) {
        o->codegen.tf32 = 1;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--microbatches"))) return parse_microbatches("--microbatches", v, o) ? -1 : 1;
    if ((v = option_value(argc, argv, i, "--accumulate"))) return parse_microbatches("--accumulate", v, o) ? -1 : 1;
    if ((v = option_value(argc, argv, i, "--hardware"))) {
        if (strcmp(v, "list") == 0) {
            const char *const *names, *const *texts;
            int n = dm_hardware_presets(&names, &texts);
            for (int k = 0; k < n; k++) printf("%s\n  %s\n", names[k], texts[k]);
            exit(0);
        }
        char err[1024];
        if (dm_hardware_load(v, &o->hardware, err, sizeof err)) {
            fprintf(stderr, "dmc: error: --hardware %s\n", err);
            return -1;
        }
        o->pipeline.cost.hardware = &o->hardware;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--precision"))) {
        if ((o->precision = dm_precision_by_name(v)) < 0) {
            fprintf(stderr, "dmc: error: --precision takes fp32, tf32 or bf16, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--memory-gb"))) {
        if (parse_size("--memory-gb", v, "GiB", &size)) return -1;
        o->pipeline.memory_limit_bytes = size * 1024 * 1024 * 1024;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--recompute"))) {
        static const char *const modes[] = {"marked", "full", "selective", "off"};
        for (int m = 0; m < 4; m++)
            if (strcmp(v, modes[m]) == 0) {
                o->recompute = m;
                return 1;
            }
        fprintf(stderr, "dmc: error: --recompute takes full, selective, marked or off, got '%s'\n", v);
        return -1;
    }
    if ((v = option_value(argc, argv, i, "--zero"))) {
        if (strlen(v) != 1 || v[0] < '0' || v[0] > '3') {
            fprintf(stderr, "dmc: error: --zero takes 0, 1, 2 or 3, got '%s'\n", v);
            return -1;
        }
        o->zero = v[0] - '0';
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--param-servers"))) {
        int64_t servers;
        if (parse_count("--param-servers", v, 1, 4096, &servers) < 0) return -1;
        o->param_servers.servers = (int)servers;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--ps-staleness"))) {
        int64_t bound;
        if (parse_count("--ps-staleness", v, 0, 1 << 20, &bound) < 0) return -1;
        o->param_servers.staleness = (int)bound;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--compress"))) {
        char err[160];
        if (dm_compress_parse(v, &o->compress, err, sizeof err) == 0) return 1;
        fprintf(stderr, "dmc: error: --compress %s\n", err);
        return -1;
    }
    if ((v = option_value(argc, argv, i, "--schedule"))) {
        o->schedule = pipe_kind_by_name(v);
        if (o->schedule < 0) {
            fprintf(stderr, "dmc: error: --schedule takes gpipe, 1f1b, interleaved, 2bw or pipedream, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--chunks"))) {
        int64_t chunks;
        if (parse_count("--chunks", v, 2, 64, &chunks) < 0) return -1;
        o->chunks = (int)chunks;
        return 1;
    }
    return 0;
}

static int check_plan_options(const options *o);

/* Every option of dmc (not the trainer's, which dmc run passes on), for "did you mean". */
static const char *const known_options[] = {
    "--set", "--mesh", "--devices", "--global-batch", "--top", "--plan-whole", "--bucket-mb", "--target", "--tf32",
    "--microbatches", "--accumulate", "--hardware", "--precision", "--memory-gb", "--recompute", "--zero",
    "--no-fuse-attention", "--sequence-parallel",
    "--schedule", "--chunks", "--compress", "--param-servers", "--ps-staleness", "--name", "--emit", "--stop-after", "--explain", "--plan", "--check", "-o", "--keep", "--cc",
    "--backend", "--mpirun", "--help", "--version"};

static void report_unknown_option(const char *arg) {
    char name[128];
    snprintf(name, sizeof name, "%s", arg);
    char *eq = strchr(name, '=');
    if (eq) *eq = 0; /* --explian=json is --explain's */
    const char *near = dm_nearest_name(name, known_options, (int)(sizeof known_options / sizeof *known_options));
    char hint[160];
    dm_format_suggestion(hint, sizeof hint, near, "", NULL, 0);
    fprintf(stderr, "dmc: error: unknown option '%s'%s (dmc --help lists them)\n", arg, hint);
}

static int parse_args(int argc, char **argv, options *o) {
    int i = 1;
    if (argc > 1 && strcmp(argv[1], "run") == 0) {
        o->run = 1;
        i = 2;
    }
    for (; i < argc; i++) {
        const char *a = argv[i], *v;
        int common;
        if (o->run && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            dm_run_usage(stdout);
            exit(0);
        }
        if (o->run && o->input && strcmp(a, "--") == 0) {
            /* the rest is the trainer's, even what dmc would take itself */
            for (i++; i < argc; i++)
                if (dm_run_trainer_arg(argc, argv, &i, o->trainer_args, &o->n_trainer_args)) return -1;
            break;
        }
        if (o->run && o->input) {
            /* after the .dm file, everything goes to the trainer except our own flags */
            int common = parse_common(argc, argv, &i, o);
            if (common < 0) return -1;
            if (common) {
            } else if ((v = option_value(argc, argv, &i, "--keep"))) {
                o->keep_dir = v;
            } else if ((v = option_value(argc, argv, &i, "--cc"))) {
                o->cc = v;
            } else if ((v = option_value(argc, argv, &i, "--backend"))) {
                o->backend = v;
            } else if ((v = option_value(argc, argv, &i, "--mpirun"))) {
                o->mpirun = v;
            } else if (dm_run_trainer_arg(argc, argv, &i, o->trainer_args, &o->n_trainer_args)) {
                return -1;
            }
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("dmc %s\n", DMC_VERSION);
            exit(0);
        } else if ((common = parse_common(argc, argv, &i, o)) != 0) {
            if (common < 0) return -1;
        } else if ((v = option_value(argc, argv, &i, "--name"))) {
            o->name = v;
        } else if ((v = option_value(argc, argv, &i, "--emit"))) {
            if (strcmp(v, "ir") != 0) {
                fprintf(stderr, "dmc: error: --emit takes 'ir', got '%s'\n", v);
                return -1;
            }
            o->emit = v;
        } else if ((v = option_value(argc, argv, &i, "--stop-after"))) {
            if (strcmp(v, "lower") && strcmp(v, "autodiff") && strcmp(v, "optimizer") && strcmp(v, "shard")) {
                fprintf(stderr, "dmc: error: --stop-after takes lower, autodiff, optimizer or shard, got '%s'\n", v);
                return -1;
            }
            o->stop_after = v;
        } else if (strcmp(a, "--explain") == 0 || strcmp(a, "--explain=text") == 0) {
            o->explain = 1 + EXPLAIN_TEXT;
        } else if (strcmp(a, "--explain=full") == 0) {
            o->explain = 1 + EXPLAIN_FULL;
        } else if (strcmp(a, "--explain=json") == 0) {
            o->explain = 1 + EXPLAIN_JSON;
        } else if (strcmp(a, "--plan") == 0 || strcmp(a, "--plan=text") == 0) {
            o->plan = 1;
        } else if (strcmp(a, "--plan=json") == 0) {
            o->plan = 2;
        } else if (strcmp(a, "--check") == 0) {
            o->check = 1;
        } else if ((v = option_value(argc, argv, &i, "-o"))) {
            o->out_dir = v;
        } else if (o->run && ((v = option_value(argc, argv, &i, "--keep")))) {
            o->keep_dir = v;
        } else if (o->run && ((v = option_value(argc, argv, &i, "--cc")))) {
            o->cc = v;
        } else if (o->run && ((v = option_value(argc, argv, &i, "--backend")))) {
            o->backend = v;
        } else if (o->run && ((v = option_value(argc, argv, &i, "--mpirun")))) {
            o->mpirun = v;
        } else if (a[0] == '-' && a[1]) {
            if (o->run) {
                if (dm_run_trainer_arg(argc, argv, &i, o->trainer_args, &o->n_trainer_args)) return -1;
                continue;
            }
            report_unknown_option(a);
            return -1;
        } else if (!o->input) {
            o->input = a;
        } else {
            fprintf(stderr, "dmc: error: more than one input file ('%s' and '%s')\n", o->input, a);
            return -1;
        }
    }
    if (!o->input) {
        fprintf(stderr, "dmc: error: no input file\n");
        if (o->run) dm_run_usage(stderr);
        else fputs(usage, stderr);
        return -1;
    }
    if (o->backend && strcmp(o->backend, "threads") != 0 && strcmp(o->backend, "mpi") != 0) {
        fprintf(stderr, "dmc: error: --backend takes threads or mpi, got '%s'\n", o->backend);
        return -1;
    }
    if (o->stop_after && !o->emit) {
        fprintf(stderr, "dmc: error: --stop-after needs --emit=ir\n");
        return -1;
    }
    if (o->mpirun && !(o->backend && strcmp(o->backend, "mpi") == 0)) {
        fprintf(stderr, "dmc: error: --mpirun needs --backend mpi\n");
        return -1;
    }
    if (!o->run && !o->emit && !o->explain && !o->check && !o->out_dir && !o->plan) {
        fprintf(stderr, "dmc: error: nothing to do: give -o DIR, --emit=ir, --explain, --plan, --check or use 'dmc run'\n");
        return -1;
    }
    return check_plan_options(o);
}

/* --plan and --mesh auto choose the mesh and what goes with it. */
static int check_plan_options(const options *o) {
    if ((o->plan || o->mesh_auto) && o->devices < 1) {
        fprintf(stderr, "dmc: error: %s needs --devices N\n", o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if (!o->plan && !o->mesh_auto && (o->devices || o->global_batch || o->top >= 0 || o->plan_whole)) {
        fprintf(stderr, "dmc: error: --devices, --global-batch, --top and --plan-whole go with --plan or --mesh auto\n");
        return -1;
    }
    if (o->plan && o->mesh_auto) {
        fprintf(stderr, "dmc: error: --plan lists plans; --mesh auto picks one to explain or run: give one of them\n");
        return -1;
    }
    const char *chosen = o->n_mesh ? "--mesh" : o->microbatches ? "--microbatches" : o->schedule >= 0 ? "--schedule"
                       : o->chunks ? "--chunks"
                       : o->zero >= 0 ? "--zero" : o->recompute != RECOMPUTE_MARKED ? "--recompute" : NULL;
    if (o->param_servers.staleness >= 0 && !o->param_servers.servers) {
        fprintf(stderr, "dmc: error: --ps-staleness bounds the parameter servers' asynchrony: it needs --param-servers S\n");
        return -1;
    }
    if ((o->plan || o->mesh_auto) && o->param_servers.servers) {
        fprintf(stderr, "dmc: error: %s does not search parameter servers: drop --param-servers, or give the mesh\n",
                o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if ((o->plan || o->mesh_auto) && o->compress.kind != COMPRESS_NONE) {
        fprintf(stderr, "dmc: error: %s does not search gradient compression: drop --compress, or give the mesh\n",
                o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if ((o->plan || o->mesh_auto) && chosen) {
        fprintf(stderr, "dmc: error: %s chooses %s itself: drop it, or drop %s\n", o->plan ? "--plan" : "--mesh auto",
                chosen, o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    return 0;
}

/* The model name: --name, or the file name without directory and .dm, made a C
 * identifier. */
static int model_name(const options *o, char *buf, size_t size) {
    const char *src = o->name;
    char from_file[256];
    if (!src) {
        const char *base = strrchr(o->input, '/');
        base = base ? base + 1 : o->input;
        snprintf(from_file, sizeof from_file, "%s", base);
        char *dot = strrchr(from_file, '.');
        if (dot && dot != from_file) *dot = 0;
        src = from_file;
    }
    size_t n = 0;
    for (const char *p = src; *p && n + 1 < size; p++) buf[n++] = isalnum((unsigned char)*p) ? (char)tolower((unsigned char)*p) : '_';
    buf[n] = 0;
    if (n == 0 || isdigit((unsigned char)buf[0])) {
        if (o->name) {
            fprintf(stderr, "dmc: error: --name '%s' is not a C identifier\n", o->name);
            return -1;
        }
        memmove(buf + 2, buf, n + 1 < size - 2 ? n + 1 : size - 2);
        buf[0] = 'm', buf[1] = '_';
    }
    return 0;
}

static int make_dir(const char *dir) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(path, 0777);
            *p = '/';
        }
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "dmc: error: cannot create directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    return 0;
}

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

/* `dmc run` passes SIGINT, SIGTERM and SIGHUP on to the program it runs (the C compiler,
 * the trainer, mpirun), which it starts in a process group of its own: a terminal's
 * Ctrl-C then reaches the trainer once, through dmc, and asks it to stop at a step
 * boundary (a second one ends it). dmc then removes its build directory. */
static volatile sig_atomic_t child_running, stop_signal_seen;
static volatile pid_t child_pid;

static void pass_on_signal(int sig) {
    stop_signal_seen = sig;
    if (child_running) kill(child_pid, sig);
}

static void pass_on_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pass_on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

static int run_process(char *const argv[]) {
    fflush(stdout);
    fflush(stderr);
    /* the child's pid is known to the handler before any signal can be passed on */
    sigset_t stops, before;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_BLOCK, &stops, &before);
    pid_t pid = fork();
    if (pid < 0) {
        sigprocmask(SIG_SETMASK, &before, NULL);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
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
    int status, waited;
    while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    child_running = 0;
    if (waited < 0) return -1;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) fprintf(stderr, "dmc: %s was killed by signal %d\n", argv[0], WTERMSIG(status));
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static int remove_tree(const char *dir) {
    char *argv[] = {"rm", "-rf", (char *)dir, NULL};
    return run_process(argv);
}

/* Appends the space-separated words of s (modified in place) to argv from index n,
 * up to index max; returns the new count. */
static int split_words(char *s, char **argv, int n, int max) {
    char *save = NULL;
    for (char *w = strtok_r(s, " ", &save); w && n < max; w = strtok_r(NULL, " ", &save)) argv[n++] = w;
    return n;
}

/* main.c of `dmc run`: the generic trainer of libdmrt; under MPI its ranks are this
 * process's one (dmrt_mpi_run). */
static int write_main(const char *path, const ir_graph *g, int mpi) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "dmc: error: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "/* main.c: written by dmc run: the generic trainer of libdmrt on model %s. */\n", g->model);
    fprintf(f, "#include \"%s.h\"\n", g->model);
    if (!mpi) {
        fprintf(f, "\nint main(int argc, char **argv) { return dmrt_trainer_main(&%s_model, argc, argv); }\n", g->model);
    } else {
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

/* nvcc: $NVCC, or the one found when dmc was built; NULL (with a message) when there is
 * none to run. */
static const char *find_nvcc(void) {
    const char *nvcc = getenv("NVCC");
    if (!nvcc || !*nvcc) nvcc = DMC_NVCC;
    if (*nvcc && access(nvcc, X_OK) == 0) return nvcc;
    fprintf(stderr, "dmc: error: --target cuda needs nvcc, the CUDA toolkit's compiler: %s (set NVCC to its path)\n",
            *nvcc ? "it is not executable here" : "none was found when dmc was built");
    return NULL;
}

/* Compiles the generated .cu into model_o with nvcc as libdmrt_cuda is compiled
 * (DMC_NVCC_FLAGS: C++, which the CUDA dialect's C also is; warnings as errors), for the
 * architecture $DMC_CUDA_ARCH or the build's (sm_90: H100, H200) with PTX for newer GPUs. */
static int compile_cuda(const char *nvcc, const char *model_cu, const char *model_o, char inc_flag[3][PATH_MAX + 2],
                        const char *out_inc_flag) {
    const char *arch = getenv("DMC_CUDA_ARCH");
    if (!arch || !*arch) arch = DMC_CUDA_ARCH;
    char gencode[2][96], flags[] = DMC_NVCC_FLAGS;
    snprintf(gencode[0], sizeof gencode[0], "arch=compute_%s,code=sm_%s", arch, arch);
    snprintf(gencode[1], sizeof gencode[1], "arch=compute_%s,code=compute_%s", arch, arch);
    char *argv[40];
    int n = 0;
    argv[n++] = (char *)nvcc;
    argv[n++] = "-c";
    n = split_words(flags, argv, n, 24);
    char *rest[] = {"-gencode", gencode[0], "-gencode", gencode[1], inc_flag[0], inc_flag[1], inc_flag[2],
                    (char *)out_inc_flag, (char *)model_cu, "-o", (char *)model_o};
    for (size_t k = 0; k < sizeof rest / sizeof *rest; k++) argv[n++] = rest[k];
    argv[n] = NULL;
    int status = run_process(argv);
    if (status != 0) fprintf(stderr, "dmc: error: compiling the generated CUDA failed (%s)\n", nvcc);
    return status;
}

static int build_and_run(const options *o, const ir_graph *g, const char *dir) {
    int mpi = o->backend && strcmp(o->backend, "mpi") == 0;
    int cuda = o->codegen.target && strcmp(o->codegen.target, "cuda") == 0;
    char main_path[PATH_MAX], exe[PATH_MAX], model_c[PATH_MAX], inc[3][PATH_MAX], lib[3][PATH_MAX],
        inc_flag[3][PATH_MAX + 2], lib_flag[3][PATH_MAX + 2], out_inc_flag[PATH_MAX + 2];
    snprintf(main_path, sizeof main_path, "%s/main.c", dir);
    snprintf(exe, sizeof exe, "%s/%s", dir, g->model);
    snprintf(model_c, sizeof model_c, "%s/%s.%s", dir, g->model, cuda ? "o" : "c");
    if (write_main(main_path, g, mpi)) return 1;
    runtime_paths(inc, lib);
    for (int i = 0; i < 3; i++) {
        snprintf(inc_flag[i], sizeof inc_flag[i], "-I%s", inc[i]);
        snprintf(lib_flag[i], sizeof lib_flag[i], "-L%s", lib[i]);
    }
    snprintf(out_inc_flag, sizeof out_inc_flag, "-I%s", dir);
    if (cuda) {
        const char *nvcc = find_nvcc();
        char model_cu[PATH_MAX];
        snprintf(model_cu, sizeof model_cu, "%s/%s.cu", dir, g->model);
        if (!nvcc || compile_cuda(nvcc, model_cu, model_c, inc_flag, out_inc_flag) != 0) return 1;
    }
    /* mpicc wraps the C compiler with MPI's flags; it must wrap the compiler that built the
     * runtime (its OpenMP and sanitizer runtimes: clang's libomp is not gcc's libgomp), so
     * Open MPI's and MPICH's wrappers are pointed at it unless the user chose otherwise */
    if (mpi && !o->cc) {
        setenv("OMPI_CC", DMC_DEFAULT_CC, 0);
        setenv("MPICH_CC", DMC_DEFAULT_CC, 0);
    }
    const char *cc = o->cc ? o->cc : mpi ? "mpicc" : getenv("CC");
    if (!cc || !*cc) cc = DMC_DEFAULT_CC;
    char flags[] = "-std=c11 -O3 -march=native -fno-math-errno " DMC_OPENMP_FLAG " " DMC_SANITIZE;
    char link[] = "-ldmrt -ldmrt_comm " DMC_LINK_FLAGS " -lm -lpthread";
    char cuda_link[] = "-ldmrt_cuda -L" DMC_CUDA_HOME "/lib64 -Wl,-rpath," DMC_CUDA_HOME "/lib64 -lcudart -lcublas -lnccl -lstdc++";
    char *cc_argv[64];
    int n = 0;
    cc_argv[n++] = (char *)cc;
    n = split_words(flags, cc_argv, n, 20);
    cc_argv[n++] = inc_flag[0];
    cc_argv[n++] = inc_flag[1];
    cc_argv[n++] = out_inc_flag;
    cc_argv[n++] = model_c;
    cc_argv[n++] = main_path;
    for (int i = 0; i < 3; i++) cc_argv[n++] = lib_flag[i];
    if (cuda) n = split_words(cuda_link, cc_argv, n, 36);
    if (mpi) cc_argv[n++] = "-ldmrt_comm_mpi";
    n = split_words(link, cc_argv, n, 58);
    cc_argv[n++] = "-o";
    cc_argv[n++] = exe;
    cc_argv[n] = NULL;
    if (stop_signal_seen) return 128 + stop_signal_seen;
    int status = run_process(cc_argv);
    if (status != 0) {
        fprintf(stderr, "dmc: error: building the generated code failed (%s%s)\n", cc,
                mpi ? "; --backend mpi needs Open MPI's mpicc and the runtime's libdmrt_comm_mpi.a" : "");
        return 1;
    }
    /* mpirun [its args] -np N [--oversubscribe --allow-run-as-root] exe args: every word of
     * --mpirun, however long (a launch across machines has many: hosts, --mca settings) */
    char np[32];
    char *mpirun = strdup(o->mpirun ? o->mpirun : "mpirun");
    if (!mpirun) return 1;
    int mpirun_words = 0;
    for (const char *c = mpirun; *c; c++)
        if (*c != ' ' && (c == mpirun || c[-1] == ' ')) mpirun_words++;
    /* the mesh's ranks, then the parameter servers' */
    snprintf(np, sizeof np, "%lld", (long long)ir_mesh_ranks(g) + g->param_servers.servers);
    char **argv = calloc((size_t)o->n_trainer_args + (size_t)mpirun_words + 16, sizeof(char *));
    if (!argv) {
        free(mpirun);
        return 1;
    }
    n = 0;
    if (mpi) {
        n = split_words(mpirun, argv, 0, mpirun_words);
        argv[n++] = "-np";
        argv[n++] = np;
        if (!o->mpirun) {
            /* more ranks than cores is what a test on one machine wants; root is what CI is */
            argv[n++] = "--oversubscribe";
            if (geteuid() == 0) argv[n++] = "--allow-run-as-root";
        }
    }
    argv[n++] = exe;
    for (int i = 0; i < o->n_trainer_args; i++) argv[n++] = o->trainer_args[i];
    argv[n] = NULL;
    status = stop_signal_seen ? 128 + stop_signal_seen : run_process(argv);
    free(argv);
    free(mpirun);
    return status;
}

/* Attention is fused where the target has the kernel, unless --no-fuse-attention. */
static int fuses_attention(const options *o) { return !o->no_fuse_attention && codegen_fuses_attention(o->codegen.target); }

static dm_lower_options lower_options(const options *o, const char *model) {
    return (dm_lower_options){.model = model, .dims = (dm_override *)o->dims, .n_dims = o->n_dims,
                              .mesh = (dm_override *)o->mesh, .n_mesh = o->n_mesh, .microbatches = o->microbatches,
                              .schedule = o->schedule, .chunks = o->chunks, .zero = o->zero,
                              .recompute = o->recompute, .fuse_attention = fuses_attention(o), .compress = o->compress,
                              .sequence_parallel = o->sequence_parallel, .param_servers = o->param_servers};
}

/* --plan: prints the plans; --mesh auto: puts the best one's choices into o (and says
 * which on stderr). Returns 0, or 1 after an error. */
static int plan(options *o, const dm_program *prog, const dm_source *src, const char *model) {
    dm_plan_request req = {.prog = prog, .src = src, .model = model, .dims = o->dims, .n_dims = o->n_dims,
                           .devices = o->devices, .global_batch = o->global_batch, .pipeline = &o->pipeline,
                           .bucket_floats = bucket_floats(o), .target = o->codegen.target, .exhaustive = o->plan_whole,
                           .fuse_attention = fuses_attention(o)};
    dm_plan_result r;
    if (dm_plan_search(&req, &r, stderr)) return 1;
    int status = 0;
    if (o->plan) {
        dm_plan_print(&req, &r, o->top >= 0 ? o->top : 5, o->plan == 2, stdout);
    } else if (r.n_fit == 0) {
        fprintf(stderr, "dmc: error: --mesh auto: no plan of %lld devices fits (dmc --plan lists them)\n",
                (long long)o->devices);
        status = 1;
    } else {
        const dm_plan_choice *best = &r.plans[0];
        char text[256];
        dm_plan_options_text(best, text, sizeof text);
        fprintf(stderr, "dmc: --mesh auto: %s (predicted step %.3f ms; dmc --plan lists the others)\n", text,
                best->step_seconds * 1e3);
        for (int a = 0; a < 3; a++)
            if (r.has_axis[a])
                o->mesh[o->n_mesh++] = (dm_override){.name = strdup(dm_plan_axes[a]), .value = best->mesh[a]};
        o->microbatches = best->microbatches;
        o->schedule = best->schedule;
        o->zero = best->zero;
        o->recompute = best->recompute;
        if (o->global_batch) {
            /* the batch the plan was made for */
            o->dims[o->n_dims++] = (dm_override){.name = strdup(r.batch_dim), .value = o->global_batch};
        }
    }
    dm_plan_result_free(&r);
    return status;
}

/* What --precision times products at; code is only generated for what it can run. */
static int resolve_precision(options *o) {
    int tf32_code = o->codegen.tf32 && o->codegen.target && strcmp(o->codegen.target, "cuda") == 0;
    if (o->precision < 0) o->precision = o->codegen.tf32 ? DM_TF32 : DM_FP32;
    o->pipeline.cost.precision = o->precision;
    if (!(o->run || o->out_dir)) return 0;
    if (o->precision == DM_BF16) {
        fprintf(stderr, "dmc: error: --precision bf16 is for planning (--explain): code generation is fp32, or tf32 with "
                        "--target cuda --tf32\n");
        return -1;
    }
    if ((o->precision == DM_TF32) != tf32_code) {
        fprintf(stderr, "dmc: error: --precision %s, but the generated code runs %s (tf32 needs --target cuda --tf32)\n",
                dm_precision_name((dm_precision)o->precision), tf32_code ? "tf32" : "fp32");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "calibrate") == 0) return dm_calibrate_main(argc - 1, argv + 1);
    options o = {0};
    o.schedule = -1;
    o.zero = -1;
    o.param_servers.staleness = -1;
    o.precision = -1;
    o.top = -1;
    o.trainer_args = calloc((size_t)argc + 1, sizeof(char *));
    char model[256];
    if (parse_args(argc, argv, &o) || resolve_precision(&o) || model_name(&o, model, sizeof model)) {
        free(o.trainer_args);
        return 2;
    }

    dm_source src;
    if (dm_source_read(&src, o.input, stderr)) {
        free(o.trainer_args);
        return 1;
    }
    dm_diag diag;
    dm_diag_init(&diag, &src, stderr);
    dm_program *prog = dm_parse(&diag);
    dm_compiled c = {0};
    int status = 1;
    if (diag.n_errors == 0 && (o.plan || o.mesh_auto)) {
        int planned = plan(&o, prog, &src, model);
        if (o.plan || planned != 0) {
            status = planned == 0 ? 0 : 1;
            dm_program_free(prog);
            goto done;
        }
    }
    if (diag.n_errors == 0) {
        dm_lower_options lo = lower_options(&o, model);
        dm_compile_request req = {.lower = &lo, .pipeline = &o.pipeline, .bucket_floats = bucket_floats(&o),
                                  .target = o.codegen.target, .stop_after = o.stop_after, .plan_memory = !o.emit};
        if (dm_compile(prog, &req, &diag, &c) == 0) status = 0;
    }
    dm_program_free(prog);
    ir_graph *g = c.g;
    if (status != 0) goto done;
    status = 1;
    if (o.emit) {
        ir_print(g, stdout);
        status = 0;
        goto done;
    }
    if (o.explain) {
        explain_print(g, &c.memory, &c.reshards, &c.pipeline, &c.zero, o.input, (explain_format)(o.explain - 1), stdout);
        status = 0;
    } else if (o.check) {
        status = 0;
    } else {
        char tmp_dir[PATH_MAX] = "";
        if (o.run) pass_on_signals(); /* from here on there is a directory to remove */
        const char *dir = o.out_dir;
        if (o.run && !dir) dir = o.keep_dir;
        int ready = 1;
        if (!dir) {
            const char *base = getenv("TMPDIR");
            snprintf(tmp_dir, sizeof tmp_dir, "%s/dmc-run-XXXXXX", base && *base ? base : "/tmp");
            if (mkdtemp(tmp_dir)) {
                dir = tmp_dir;
            } else {
                fprintf(stderr, "dmc: error: cannot create a temporary directory: %s\n", strerror(errno));
                tmp_dir[0] = 0;
                ready = 0;
            }
        } else if (make_dir(dir)) {
            ready = 0;
        }
        if (ready) {
            codegen_plans plans = {.memory = &c.memory, .pipeline = &c.pipeline, .buckets = &c.buckets, .zero = &c.zero,
                                   .compress = &c.compress};
            status = codegen_write(g, &plans, o.input, src.text, src.len, &o.codegen, dir, stderr) ? 1 : 0;
            if (status == 0 && o.run) {
                status = build_and_run(&o, g, dir);
                /* a build the signal ended reports that, not a failure of its own */
                if (stop_signal_seen && status == 1) status = 128 + stop_signal_seen;
            }
        }
        if (tmp_dir[0]) remove_tree(tmp_dir);
    }
done:
    dm_compiled_free(&c);
    dm_source_free(&src);
    for (int i = 0; i < o.n_dims; i++) free((char *)o.dims[i].name);
    for (int i = 0; i < o.n_mesh; i++) free((char *)o.mesh[i].name);
    free(o.trainer_args);
    return status;
}
