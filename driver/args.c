/* args.c: dmc's command line (args.h): the usage text, the options of every command
 * (parse_common, also taken after the .dm file of `dmc run`), dmc run's own
 * (parse_run_own), the rest passed to the trainer (run_options.c checks them), and the
 * checks of options against each other (check_options, check_plan_options). */
#include "args.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "explain.h"
#include "run_options.h"
#include "schedule.h"
#include "suggest.h"

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
    "       one command at a time: -o DIR goes alone, or with dmc run (which keeps its build there)\n"
    "\n"
    "options (every command):\n"
    "  --set NAME=N[,NAME=N...]   override dimension constants (dim NAME = ...); repeatable, the\n"
    "                             last value of a name wins\n"
    "  --mesh AXIS=N[,AXIS=N...]  override mesh axis sizes (mesh(AXIS = ...))\n"
    "  --mesh auto                the best plan --plan finds for --devices N (it also chooses\n"
    "                             --microbatches, --schedule, --zero and --recompute)\n"
    "  --name PREFIX              symbol prefix of the generated code: a C identifier, used as\n"
    "                             given (default: the file name, lowercased, other characters _)\n"
    "  --stop-after=PASS          with --emit=ir: stop after lower, autodiff, optimizer or shard\n"
    "  -o DIR                     output directory (created if missing)\n"
    "  --target c|cuda            generated code: C for CPUs (default), or CUDA with cuBLAS\n"
    "                             and NCCL for NVIDIA GPUs (dmc run compiles it with nvcc)\n"
    "  --tf32                     cuda: matrix products may use TF32 (default strict fp32)\n"
    "  --hardware NAME|FILE       the machine plans are timed on: a preset (nominal, the\n"
    "                             default; cpu-2core, a100-80gb-sxm, h100-80gb-sxm) or a JSON\n"
    "                             file (docs/cost.md); --hardware list prints the presets\n"
    "  --precision fp32|tf32|bf16|fp16 the precision of matrix products (default fp32, tf32\n"
    "                             with --tf32); bf16, fp16: their operands rounded to 16 bits,\n"
    "                             products summed and stored in f32, f32 master weights and\n"
    "                             optimizer state (docs/precision.md)\n"
    "  --quantize MODE            an inference program with narrow weights (serial; C or CUDA;\n"
    "                             docs/compression.md): int8-weights (int8, a scale per\n"
    "                             output channel) or int4-weights[:G] (int4, a scale per G\n"
    "                             rows of an output channel, default 64); weights of the\n"
    "                             products x @ W, quantized from --init's f32 file at load or\n"
    "                             read from a --save-quantized file; it predicts, not trains:\n"
    "                             compiled from the forward alone (no gradients or optimizer\n"
    "                             state; C target: no f32 copy of an int8-weights/int4 weight\n"
    "                             that only its products read).\n"
    "                             int8: int8 weights as int8-weights and the products' inputs\n"
    "                             int8 too (a scale per tensor, calibrated on training rows:\n"
    "                             trainer --calibrate), int8 x int8 products summed in int32\n"
    "                             (oneDNN with AVX512-VNNI, else plain C; CUDA: cuBLAS)\n"
    "  --quantize-group G         int4-weights: rows per scale (as int4-weights:G)\n"
    "  --quantize-embeddings      with --quantize: the tables embeddings read narrow too (a\n"
    "                             head tied to one included: GPT's wte), a scale per row\n"
    "                             (default: they stay f32, as bitsandbytes and GPTQ leave them)\n"
    "  --loss-scale S             fp16: the initial loss scale (default 65536), halved and the\n"
    "                             step skipped when a gradient is not finite\n"
    "  --loss-scale-interval N    fp16: clean steps before the scale doubles (default 2000)\n"
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
    "  --prune RATIO[:rows]       magnitude pruning of every weight matrix (of products) while\n"
    "                             training: its sparsity ramps from 0 to RATIO (0 <= RATIO < 1)\n"
    "                             on a cubic schedule; masks in the optimizer state, pruned\n"
    "                             weights exactly 0 after every update; :rows prunes whole\n"
    "                             output channels by their L2 norm, and an attention's\n"
    "                             weights by whole heads (docs/compression.md)\n"
    "  --prune-start F, --prune-end F\n"
    "                             the ramp's first and last fractions of the run's updates\n"
    "                             (default 0 and 0.75)\n"
    "  --compact PRUNED           the smaller program of PRUNED's weights (a --save of a run\n"
    "                             with --prune RATIO:rows): each product's all-zero output\n"
    "                             channels removed where they only feed the next product, its\n"
    "                             bias and the next weight's rows with them, and each\n"
    "                             attention's all-zero heads; --explain says\n"
    "                             which weights shrank and why others did not; -o and dmc run\n"
    "                             write the compacted weights, which dmc run passes as --init\n"
    "  --save-compacted FILE      where -o and dmc run write --compact's compacted weights\n"
    "                             (default: compacted.safetensors in -o's or dmc run's directory)\n"
    "  --memory-gb X              memory per rank the pipeline cut must fit (default: no limit)\n"
    "  --recompute MODE           activation recomputation: full (every layer call keeps only\n"
    "                             its inputs for the backward pass, which makes the rest\n"
    "                             again), selective (only cheap ops: not products), marked\n"
    "                             (default: the calls the .dm wraps in recompute(...)), off\n"
    "  --no-fuse-attention        keep softmax(causal_mask(q @ kT * s)) @ v as its three ops\n"
    "                             (the C and CUDA targets fuse it into one kernel that holds\n"
    "                             no T x T scores; CUDA's runs through cuDNN under bf16 and\n"
    "                             fp16: docs/compiler.md, docs/gpu.md)\n"
    "  --no-fuse-casts            under --precision bf16/fp16, round each product operand in\n"
    "                             a loop of its own, as dmc did before, not in the loop of\n"
    "                             the op that makes it (C and CUDA targets; the same bits)\n"
    "  --no-hoist-constants       compute the values that depend on no input, parameter or\n"
    "                             random draw (tables from arange: RoPE's) in every step, as\n"
    "                             dmc did before, not once when the context is created\n"
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
    "                             feedback); none (default). bf16 and fp16 with ZeRO: its\n"
    "                             reduce-scatters carry 16 bits; topk and powersgd not with\n"
    "                             ZeRO; CUDA: staged through host memory\n"
    "  --grad-reduce fp32|bf16    the gradients' allreduce over data in fp32 (default) or bf16,\n"
    "                             half the bytes (mixed precision's name for --compress bf16);\n"
    "                             one of --compress and --grad-reduce, once\n"
    "  --param-servers S          data parallelism through S parameter servers, world ranks\n"
    "                             after the mesh's: each holds a shard of the parameters and\n"
    "                             its optimizer state; workers push gradients and pull\n"
    "                             parameters (synchronous: the allreduce's result, bit for\n"
    "                             bit). A mesh of the data axis only; CUDA: the workers'\n"
    "                             buffers staged to the servers (docs/parallelism.md)\n"
    "  --ps-staleness K           with --param-servers: asynchronous, each push applied as it\n"
    "                             comes, no worker more than K steps ahead of the slowest\n"
    "  --help, --version\n"
    "\n"
    "--plan and --mesh auto: --devices N (required), --global-batch B (the inputs' leading\n"
    "  dim; default the program's), --memory-gb X (per device; default the hardware's),\n"
    "  --hardware, --precision, --top K (plans printed, default 5; 0 all), --plan-whole\n"
    "  (compile every plan whole instead of estimating deep models from two-layer probes)\n"
    "\n"
    "dmc run: dmc run --help lists its options (--keep, --cc, --backend, --mpirun, --march,\n"
    "  --teacher, --teacher-init, --distill-temperature, --distill-alpha: distillation, which\n"
    "  --check also takes, to try them)\n"
    "  and the trainer's (--steps, --epochs, --seed, --save, --data, ...: docs/trainer.md).\n";


static int parse_overrides(const char *flag, const char *list, dm_override *out, int *n, int max) {
    char *copy = strdup(list), *save = NULL;
    int status = 0;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        char *end = NULL;
        errno = 0;
        long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
        if (!eq || eq == item || !end || *end || end == eq + 1) {
            fprintf(stderr, "dmc: error: %s expects NAME=INTEGER[,NAME=INTEGER...], got '%s'\n", flag, item);
            status = -1;
            break;
        }
        if (errno == ERANGE) {
            /* strtoll clamps to INT64_MAX (or MIN): the program would get a value not given */
            fprintf(stderr, "dmc: error: %s %s: the value does not fit in a 64-bit integer\n", flag, item);
            status = -1;
            break;
        }
        *eq = 0;
        int same = 0; /* a name given again: the later value wins, as with any repeated option */
        while (same < *n && strcmp(out[same].name, item) != 0) same++;
        if (same < *n) {
            out[same].value = v;
            continue;
        }
        if (*n == max) {
            fprintf(stderr, "dmc: error: too many %s overrides\n", flag);
            status = -1;
            break;
        }
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
static int parse_count(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);

/* --quantize int8 | int8-weights | int4-weights[:G]: 1, or -1 after a message. A
 * --quantize given again replaces the earlier one whole (its activations, its :G), as every
 * option's last value wins; a --quantize-group of its own stays. */
static int parse_quantize(const char *v, dm_options *o) {
    o->codegen.quantize_activations = 0;
    if (o->quantize_group_of_mode) o->codegen.quantize_group = 0;
    o->quantize_group_of_mode = 0;
    if (strcmp(v, "int8-weights") == 0) {
        o->codegen.quantize_bits = 8;
        return 1;
    }
    if (strncmp(v, "int4-weights", 12) == 0 && (v[12] == 0 || v[12] == ':')) {
        o->codegen.quantize_bits = 4;
        if (!v[12]) return 1;
        o->quantize_group_of_mode = 1;
        return parse_count("--quantize int4-weights:G", v + 13, 1, 1 << 20, &o->codegen.quantize_group) < 0 ? -1 : 1;
    }
    if (strcmp(v, "int8") == 0) {
        o->codegen.quantize_bits = 8;
        o->codegen.quantize_activations = 1;
        return 1;
    }
    fprintf(stderr, "dmc: error: --quantize takes int8, int8-weights or int4-weights[:G], got '%s'\n", v);
    return -1;
}

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

/* --prune RATIO[:rows] (RATIO from 0, below 1), --prune-start F and --prune-end F (fractions
 * of the run, start before end): 1, or -1 with a message. */
static int parse_prune(const char *flag, const char *v, dm_options *o) {
    char *end = NULL;
    double x = strtod(v, &end);
    int ratio = strcmp(flag, "--prune") == 0, rows = ratio && end && strcmp(end, ":rows") == 0;
    if (!end || (*end && !rows) || end == v || !(x >= 0.0 && (ratio ? x < 1.0 : x <= 1.0))) {
        fprintf(stderr, "dmc: error: %s expects %s, got '%s'\n", flag,
                ratio ? "the fraction of every weight matrix pruned, a number from 0 up to (not including) 1, "
                        "optionally followed by :rows (whole output channels)"
                      : "a fraction of the run's updates, a number from 0 to 1", v);
        return -1;
    }
    if (ratio) o->prune.ratio = x, o->prune.rows = rows;
    else *(strcmp(flag, "--prune-start") == 0 ? &o->prune.start : &o->prune.end) = x;
    o->prune_window_given |= !ratio;
    return 1;
}

/* --microbatches M and --accumulate K both set the micro-batches (an accumulation is a
 * schedule's micro-batches on one stage): the two with different values are refused, as a
 * .dm file's accumulate = K beside its schedule's microbatches = M is; one flag given twice
 * takes its last value, as every option does. */
static int parse_microbatches(const char *flag, const char *v, dm_options *o) {
    int64_t m;
    if (parse_count(flag, v, 1, 4096, &m) < 0) return -1;
    if (o->microbatches_flag && strcmp(o->microbatches_flag, flag) != 0 && o->microbatches != (int)m) {
        fprintf(stderr, "dmc: error: %s %d and %s %lld both set the micro-batches, to different counts\n",
                o->microbatches_flag, o->microbatches, flag, (long long)m);
        return -1;
    }
    o->microbatches = (int)m;
    o->microbatches_flag = flag;
    return 0;
}

/* The choices of parallelism and memory (recomputation, ZeRO, parameter servers,
 * compression, the pipeline's schedule): parse_common's answer. */

/* --compress and --grad-reduce both choose how gradients are reduced: one of them, once
 * (in either order, --grad-reduce fp32 included). 1 after the error, else 0. */
static int reduce_chosen_twice(dm_options *o, const char *option) {
    if (o->reduce_chosen_by) {
        if (strcmp(o->reduce_chosen_by, option) == 0)
            fprintf(stderr, "dmc: error: %s given twice: give it once\n", option);
        else
            fprintf(stderr, "dmc: error: --grad-reduce and --compress both choose how gradients are reduced: give one\n");
        return 1;
    }
    o->reduce_chosen_by = option;
    return 0;
}
static int parse_parallelism(int argc, char **argv, int *i, dm_options *o) {
    const char *v;
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
    if ((v = option_value(argc, argv, i, "--grad-reduce"))) {
        /* mixed precision's name for 16-bit gradient reduction: --compress bf16's wire format */
        char err[160];
        if (strcmp(v, "fp32") != 0 && strcmp(v, "bf16") != 0) {
            fprintf(stderr, "dmc: error: --grad-reduce takes fp32 (the default) or bf16, got '%s'\n", v);
            return -1;
        }
        if (reduce_chosen_twice(o, "--grad-reduce")) return -1;
        if (strcmp(v, "bf16") == 0 && dm_compress_parse("bf16", &o->compress, err, sizeof err) != 0) return -1;
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--compress"))) {
        char err[160];
        if (reduce_chosen_twice(o, "--compress")) return -1;
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

/* The options of the compiler proper, also taken after the .dm file of `dmc run`:
 * 1 when argv[*i] was one, 0 when not, -1 on a bad value. */
static int parse_common(int argc, char **argv, int *i, dm_options *o) {
    const char *v;
    if ((v = option_value(argc, argv, i, "--set")))
        return parse_overrides("--set", v, o->dims, &o->n_dims, DM_MAX_DIMS) ? -1 : 1;
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
    if (strcmp(argv[*i], "--no-hoist-constants") == 0) return o->no_hoist_constants = 1;
    if (strcmp(argv[*i], "--no-fuse-casts") == 0) return o->no_fuse_casts = 1;
    if (strcmp(argv[*i], "--sequence-parallel") == 0) return o->sequence_parallel = 1;
    if (strcmp(argv[*i], "--quantize-embeddings") == 0) return o->quantize_embeddings = 1;
    double size;
    if ((v = option_value(argc, argv, i, "--bucket-mb"))) {
        if (parse_size("--bucket-mb", v, "MiB", &size)) return -1;
        /* a size under a byte is the smallest bucket, not the default (0 means unset) */
        o->bucket_bytes = (int64_t)ceil(size * 1024 * 1024);
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
        o->precision_given = 1;
        if ((o->precision = dm_precision_by_name(v)) < 0) {
            fprintf(stderr, "dmc: error: --precision takes fp32, tf32, bf16 or fp16, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--quantize"))) return parse_quantize(v, o);
    if ((v = option_value(argc, argv, i, "--quantize-group"))) {
        o->quantize_group_of_mode = 0;
        return parse_count("--quantize-group", v, 1, 1 << 20, &o->codegen.quantize_group) < 0 ? -1 : 1;
    }
    if ((v = option_value(argc, argv, i, "--loss-scale"))) {
        char *end = NULL;
        o->loss_scale = strtod(v, &end);
        /* below 2^64: a float holds the scale and its square stays finite in the checks */
        if (!end || *end || end == v || !(o->loss_scale >= 1.0 && o->loss_scale <= 0x1p64)) {
            fprintf(stderr, "dmc: error: --loss-scale expects a number from 1 to 2^64, got '%s'\n", v);
            return -1;
        }
        return 1;
    }
    if ((v = option_value(argc, argv, i, "--loss-scale-interval")))
        return parse_count("--loss-scale-interval", v, 1, INT64_MAX / 2, &o->loss_scale_interval);
    if ((v = option_value(argc, argv, i, "--compact"))) return o->compact = v, 1;
    if ((v = option_value(argc, argv, i, "--save-compacted"))) return o->save_compacted = v, 1;
    static const char *const prune_flags[] = {"--prune", "--prune-start", "--prune-end"};
    for (int k = 0; k < 3; k++)
        if ((v = option_value(argc, argv, i, prune_flags[k]))) return parse_prune(prune_flags[k], v, o);
    if ((v = option_value(argc, argv, i, "--memory-gb"))) {
        if (parse_size("--memory-gb", v, "GiB", &size)) return -1;
        o->pipeline.memory_limit_bytes = size * 1024 * 1024 * 1024;
        return 1;
    }
    return parse_parallelism(argc, argv, i, o);
}

static int check_plan_options(const dm_options *o);
static int check_compact_options(const dm_options *o);

/* Every option of dmc (not the trainer's, which dmc run passes on), for "did you mean". */
static const char *const known_options[] = {
    "--set", "--mesh", "--devices", "--global-batch", "--top", "--plan-whole", "--bucket-mb", "--target", "--tf32",
    "--microbatches", "--accumulate", "--hardware", "--precision", "--loss-scale", "--loss-scale-interval", "--memory-gb", "--recompute", "--zero",
    "--prune", "--prune-start", "--prune-end", "--compact", "--save-compacted", "--no-fuse-attention", "--no-hoist-constants", "--no-fuse-casts", "--quantize", "--quantize-group", "--quantize-embeddings", "--sequence-parallel",
    "--schedule", "--chunks", "--compress", "--grad-reduce", "--param-servers", "--ps-staleness", "--name", "--emit", "--stop-after", "--explain", "--plan", "--check", "-o", "--keep", "--cc", "--teacher", "--teacher-init", "--distill-temperature", "--distill-alpha",
    "--backend", "--mpirun", "--march", "--help", "--version"};

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

/* dmc run's own options (--keep, --cc, --backend, --mpirun, --march): 1 when argv[*i] is
 * one (its value taken), else 0. */
static int parse_run_own(int argc, char **argv, int *i, dm_options *o) {
    static const char *const names[] = {"--keep", "--cc", "--backend", "--mpirun", "--march"};
    const char **fields[] = {&o->keep_dir, &o->cc, &o->backend, &o->mpirun, &o->march};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *v = option_value(argc, argv, i, names[k]);
        if (v) {
            *fields[k] = v;
            return 1;
        }
    }
    return 0;
}

/* Distillation's options (driver/distill.c), dmc run's and --check's: 1 when argv[*i] is
 * one (its value taken), else 0. */
static int parse_distill(int argc, char **argv, int *i, dm_options *o) {
    static const char *const names[] = {"--teacher", "--teacher-init", "--distill-temperature", "--distill-alpha"};
    const char **fields[] = {&o->teacher, &o->teacher_init, &o->distill_temperature, &o->distill_alpha};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *v = option_value(argc, argv, i, names[k]);
        if (v) {
            *fields[k] = v;
            return 1;
        }
    }
    return 0;
}

/* The commands, and whether the options give each. */
enum { N_COMMANDS = 5 };
static const char *const command_names[N_COMMANDS] = {"dmc run", "--plan", "--emit=ir", "--explain", "--check"};

static void commands_given(const dm_options *o, int given[N_COMMANDS]) {
    given[0] = o->run, given[1] = o->plan != 0, given[2] = o->emit != NULL, given[3] = o->explain != 0,
    given[4] = o->check;
}

/* The command the options give (the first, for messages), or NULL for -o alone. */
static const char *command_name(const dm_options *o) {
    int given[N_COMMANDS];
    commands_given(o, given);
    for (int k = 0; k < N_COMMANDS; k++)
        if (given[k]) return command_names[k];
    return NULL;
}

/* One command at a time: each took precedence over the others without a word (--check
 * beside --explain checked nothing), and -o DIR, which writes the code, goes with dmc run
 * (where it keeps the build) or alone. 0, or -1 after a message. */
static int check_commands(const dm_options *o) {
    int given[N_COMMANDS];
    commands_given(o, given);
    const char *first = NULL;
    for (int k = 0; k < N_COMMANDS; k++) {
        if (!given[k]) continue;
        if (first) {
            fprintf(stderr, "dmc: error: %s and %s are two commands: give one of them\n", first, command_names[k]);
            return -1;
        }
        first = command_names[k];
    }
    if (o->out_dir && first && !o->run) {
        fprintf(stderr, "dmc: error: -o DIR writes the generated code, which %s does not: give one of them\n", first);
        return -1;
    }
    return 0;
}

/* The options against each other, once all are parsed: 0, or -1 after a message. */
static int check_options(const dm_options *o) {
    if (!o->input) {
        fprintf(stderr, "dmc: error: no input file\n");
        if (o->run) dm_run_usage(stderr);
        else fputs(usage, stderr);
        return -1;
    }
    if (check_commands(o)) return -1;
    if (o->teacher && !o->run && !o->check) {
        fprintf(stderr, "dmc: error: --teacher is for dmc run (and dmc --check, which tries it): -o, --emit and "
                        "--explain do not build the teacher\n");
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
    if (o->march && (!*o->march || strlen(o->march) > 64 || strspn(o->march, "abcdefghijklmnopqrstuvwxyz"
                                                                            "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") != strlen(o->march))) {
        fprintf(stderr, "dmc: error: --march takes an instruction set as gcc's -march does (native, x86-64, x86-64-v3, "
                        "znver4, ...), got '%s'\n", o->march);
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
    if (o->prune_window_given && o->prune.ratio == 0) {
        fprintf(stderr, "dmc: error: --prune-start and --prune-end only apply with --prune RATIO\n");
        return -1;
    }
    if (o->prune.start >= o->prune.end && o->prune.ratio > 0) {
        fprintf(stderr, "dmc: error: --prune-start (%g) must come before --prune-end (%g): the sparsity ramps between "
                        "them\n", o->prune.start, o->prune.end);
        return -1;
    }
    return check_compact_options(o) ? -1 : check_plan_options(o);
}

/* Whether the trainer's arguments hold flag (as FLAG or FLAG=VALUE). */
static int trainer_arg_given(const dm_options *o, const char *flag) {
    size_t n = strlen(flag);
    for (int k = 0; k < o->n_trainer_args; k++)
        if (strncmp(o->trainer_args[k], flag, n) == 0 && (!o->trainer_args[k][n] || o->trainer_args[k][n] == '='))
            return 1;
    return 0;
}

/* --compact's company: 0, or -1 after a message. */
static int check_compact_options(const dm_options *o) {
    if (o->save_compacted && !o->compact) {
        fprintf(stderr, "dmc: error: --save-compacted writes what --compact PRUNED makes: give --compact\n");
        return -1;
    }
    struct stat pruned, compacted;
    if (o->save_compacted && stat(o->compact, &pruned) == 0 && stat(o->save_compacted, &compacted) == 0 &&
        pruned.st_dev == compacted.st_dev && pruned.st_ino == compacted.st_ino) {
        /* before anything is written: compacting is not undone */
        fprintf(stderr, "dmc: error: --save-compacted %s is the --compact file: the compacted weights would replace "
                        "the pruned ones (give --save-compacted another file)\n", o->save_compacted);
        return -1;
    }
    if (o->compact && (o->plan || o->mesh_auto)) {
        fprintf(stderr, "dmc: error: --compact cannot be combined with %s: the plans are made for the uncompacted "
                        "shapes; give the mesh\n", o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if (o->save_compacted && !o->out_dir && !o->run) {
        /* the modes that write no files would drop it without a word */
        fprintf(stderr, "dmc: error: --save-compacted: %s writes no files (-o DIR and dmc run write the compacted "
                        "weights)\n", command_name(o));
        return -1;
    }
    if (o->compact && o->run && trainer_arg_given(o, "--init")) {
        fprintf(stderr, "dmc: error: --init cannot be given with --compact %s: dmc run passes the program the "
                        "compacted weights itself\n", o->compact);
        return -1;
    }
    if (o->compact && o->run && trainer_arg_given(o, "--resume")) {
        /* dmc run gives the compacted weights as --init, which the trainer's --resume refuses */
        fprintf(stderr, "dmc: error: --resume cannot be given with --compact %s: dmc run starts the compacted "
                        "program from the compacted weights (as --init), and a run starts from those or from a "
                        "checkpoint, not both\n", o->compact);
        return -1;
    }
    return 0;
}

static int parse_args_into(int argc, char **argv, dm_options *o) {
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
            /* after the .dm file, everything goes to the trainer except our own flags (those
             * of dmc --help's "every command" too: --name, -o) */
            int common = parse_common(argc, argv, &i, o);
            if (common < 0) return -1;
            if (common) {
            } else if ((v = option_value(argc, argv, &i, "--name"))) {
                o->name = v;
            } else if ((v = option_value(argc, argv, &i, "-o"))) {
                o->out_dir = v;
            } else if (parse_run_own(argc, argv, &i, o) || parse_distill(argc, argv, &i, o)) {
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
        } else if ((o->run && parse_run_own(argc, argv, &i, o)) || parse_distill(argc, argv, &i, o)) {
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
    return check_options(o);
}

/* --plan and --mesh auto choose the mesh and what goes with it. */
static int check_plan_options(const dm_options *o) {
    if ((o->plan || o->mesh_auto) && o->devices < 1) {
        fprintf(stderr, "dmc: error: %s needs --devices N\n", o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if (!o->plan && !o->mesh_auto && (o->devices || o->global_batch || o->top >= 0 || o->plan_whole)) {
        fprintf(stderr, "dmc: error: --devices, --global-batch, --top and --plan-whole go with --plan or --mesh auto\n");
        return -1;
    }
    if (o->mesh_auto && o->global_batch && o->n_dims >= DM_MAX_DIMS) {
        /* the chosen plan's batch is one more --set (dmc.c's plan) */
        fprintf(stderr, "dmc: error: --mesh auto --global-batch sets the batch dim beside the --set ones: give at most "
                        "%d of those\n", DM_MAX_DIMS - 1);
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

int dm_parse_args(int argc, char **argv, dm_options *o) {
    *o = (dm_options){.schedule = -1, .zero = -1, .param_servers.staleness = -1, .precision = -1, .top = -1,
                      .prune = {.start = DM_PRUNE_START, .end = DM_PRUNE_END}};
    o->trainer_args = calloc((size_t)argc + 1, sizeof(char *));
    if (!o->trainer_args) return -1;
    return parse_args_into(argc, argv, o);
}

/* --quantize's group and company, once the precision is known: 0, or -1 after a message. */
static int check_quantize_options(dm_options *o) {
    if (o->codegen.quantize_bits == 4 && !o->codegen.quantize_group) o->codegen.quantize_group = 64;
    if (o->quantize_embeddings && !o->codegen.quantize_bits) {
        fprintf(stderr, "dmc: error: --quantize-embeddings applies to a --quantize program only\n");
        return -1;
    }
    if (o->codegen.quantize_group && o->codegen.quantize_bits != 4) {
        fprintf(stderr, "dmc: error: --quantize-group applies to --quantize int4-weights only\n");
        return -1;
    }
    if (o->codegen.quantize_bits && o->precision != DM_FP32) {
        fprintf(stderr, "dmc: error: --quantize reads f32 activations: it cannot be combined with --precision %s\n",
                dm_precision_name((dm_precision)o->precision));
        return -1;
    }
    if (o->codegen.quantize_bits && (o->plan || o->mesh_auto)) {
        /* the plans are meshes and schedules of a training step; a quantized program is one serial forward */
        fprintf(stderr, "dmc: error: --quantize makes a serial program that predicts, and %s searches meshes for "
                        "training: plan the f32 program, or drop %s\n", o->plan ? "--plan" : "--mesh auto",
                o->plan ? "--plan" : "--mesh auto");
        return -1;
    }
    if (o->codegen.quantize_bits && o->prune.ratio > 0) {
        /* pruning happens in the updates, which a quantized program never runs: nothing would be pruned */
        fprintf(stderr, "dmc: error: --quantize makes a program that predicts and never trains, and --prune prunes in "
                        "the training updates: prune by training the f32 program (--prune, --save), then quantize "
                        "its saved weights (--quantize with --init)\n");
        return -1;
    }
    return 0;
}

int dm_resolve_precision(dm_options *o) {
    /* --tf32 reaches the code where the target's toolchain says it does (cuda) */
    int tf32_code = o->codegen.tf32 && codegen_toolchain_of(o->codegen.target)->tf32;
    if (o->precision < 0) o->precision = o->codegen.tf32 ? DM_TF32 : DM_FP32;
    o->pipeline.cost.precision = o->precision;
    if (check_quantize_options(o)) return -1;
    /* --check refuses what -o would (--explain and --plan only predict, at any precision) */
    if (!(o->run || o->out_dir || o->check)) return 0;
    /* bf16: the products' operands cast (passes/precision.c); a target without them says so */
    if (o->precision == DM_BF16 || o->precision == DM_FP16) return 0;
    if ((o->precision == DM_TF32) != tf32_code) {
        fprintf(stderr, "dmc: error: --precision %s, but the generated code runs %s (tf32 needs --target cuda --tf32)\n",
                dm_precision_name((dm_precision)o->precision), tf32_code ? "tf32" : "fp32");
        return -1;
    }
    return 0;
}

/* A --name is the prefix of every symbol as given: one that is not a C identifier (or
 * does not fit) is refused, not rewritten, since its user would look for symbols that
 * are not there. */
static int given_name(const char *name, char *buf, size_t size) {
    size_t n = strlen(name);
    int ok = n > 0 && !isdigit((unsigned char)name[0]);
    for (size_t k = 0; ok && k < n; k++) ok = isalnum((unsigned char)name[k]) || name[k] == '_';
    if (n >= size) {
        fprintf(stderr, "dmc: error: --name '%s' is longer than %zu characters\n", name, size - 1);
        return -1;
    }
    if (!ok) {
        fprintf(stderr, "dmc: error: --name '%s' is not a C identifier (letters, digits and _, not starting with a "
                        "digit)\n", name);
        return -1;
    }
    memcpy(buf, name, n + 1);
    return 0;
}

int dm_model_name(const dm_options *o, char *buf, size_t size) {
    if (o->name) return given_name(o->name, buf, size);
    char from_file[256];
    const char *base = strrchr(o->input, '/');
    base = base ? base + 1 : o->input;
    snprintf(from_file, sizeof from_file, "%s", base);
    char *dot = strrchr(from_file, '.');
    if (dot && dot != from_file) *dot = 0;
    /* a file name that starts with a digit (or is empty) gets the prefix m_, so room for
     * it and the terminating 0 is kept: the name is cut, never unterminated */
    size_t skip = !from_file[0] || isdigit((unsigned char)from_file[0]) ? 2 : 0, n = skip;
    for (const char *p = from_file; *p && n + 1 < size; p++)
        buf[n++] = isalnum((unsigned char)*p) ? (char)tolower((unsigned char)*p) : '_';
    buf[n] = 0;
    if (skip) buf[0] = 'm', buf[1] = '_';
    return 0;
}

void dm_options_free(dm_options *o) {
    for (int i = 0; i < o->n_dims; i++) free((char *)o->dims[i].name);
    for (int i = 0; i < o->n_mesh; i++) free((char *)o->mesh[i].name);
    free(o->trainer_args);
}
