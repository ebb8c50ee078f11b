/* args.h: dmc's command line: the options of every command, `dmc run`'s own (--keep,
 * --cc, --backend, --mpirun, --march) and the trainer's arguments it passes on
 * (run_options.h checks those), parsed and checked against each other before anything is
 * compiled. Usage errors are said on stderr; --help, --version and --hardware list print
 * and exit 0. */
#ifndef DMC_ARGS_H
#define DMC_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "codegen.h"
#include "hardware.h"
#include "lower.h"
#include "passes.h"

/* --prune's ramp by default: from the start of the run to 3/4 of its updates */
#define DM_PRUNE_START 0.0
#define DM_PRUNE_END 0.75
/* --set's distinct names */
#define DM_MAX_DIMS 64

typedef struct dm_options {
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
    const char *march;        /* dmc run --march: the instruction set of the built program (NULL: native) */
    const char *teacher;      /* dmc run --teacher: the teacher's .dm (driver/distill.c), or NULL */
    const char *teacher_init; /* dmc run --teacher-init: its weights */
    const char *distill_temperature, *distill_alpha; /* as given, or NULL (checked by driver/distill.c) */
    codegen_options codegen;
    int quantize_group_of_mode; /* codegen.quantize_group came from --quantize int4-weights:G, not --quantize-group */
    int64_t bucket_bytes;     /* --bucket-mb, in bytes (0: the default) */
    dm_override dims[DM_MAX_DIMS];
    int n_dims;
    dm_override mesh[IR_MAX_AXES];
    int n_mesh;
    int microbatches;         /* --microbatches / --accumulate, 0: the program's */
    const char *microbatches_flag; /* the one of the two that set it, or NULL */
    int schedule;             /* --schedule, -1: the program's */
    int chunks;               /* --chunks, 0: the program's */
    int zero;                 /* --zero, -1: the program's */
    int recompute;            /* --recompute as an ir_recompute */
    int no_fuse_attention;    /* --no-fuse-attention */
    int no_hoist_constants;   /* --no-hoist-constants */
    int no_fuse_casts;        /* --no-fuse-casts */
    int sequence_parallel;    /* --sequence-parallel */
    int quantize_embeddings;  /* --quantize-embeddings */
    ir_compress compress;     /* --compress */
    const char *reduce_chosen_by; /* "--compress" or "--grad-reduce", the one given (NULL: neither) */
    ir_param_servers param_servers; /* --param-servers, --ps-staleness (-1: synchronous) */
    dm_pipeline_options pipeline;
    dm_hardware hardware;     /* --hardware (pipeline.cost.hardware points here) */
    int precision;            /* --precision, -1: fp32, or tf32 with --tf32 */
    int precision_given;      /* --precision was given (it wins over a precision statement) */
    double loss_scale;        /* --loss-scale (fp16), 0: the default */
    int64_t loss_scale_interval; /* --loss-scale-interval (fp16), 0: the default */
    ir_prune prune;           /* --prune RATIO, --prune-start F, --prune-end F (ratio 0: none) */
    int prune_window_given;   /* --prune-start or --prune-end was given */
    const char *compact;      /* --compact PRUNED: the weights whose zero channels are removed, or NULL */
    const char *save_compacted; /* --save-compacted FILE: where the compacted weights go (NULL: -o's or
                               * dmc run's directory, compacted.safetensors) */
    const char *compacted_init; /* dmc run --compact: the compacted weights the trainer gets as --init */
    char **trainer_args;      /* passed through to the trainer */
    int n_trainer_args;
} dm_options;

/* Parses argv into o (which it initialises: free it with dm_options_free): 0, or -1 after
 * a message. */
int dm_parse_args(int argc, char **argv, dm_options *o);
/* What --precision times products at (fp32, or tf32 with --tf32, by default), checked
 * against the code generated: 0, or -1 after a message. */
int dm_resolve_precision(dm_options *o);
/* The model name: --name, or the file name without directory and .dm, made a C
 * identifier, into buf: 0, or -1 after a message (a --name that is not one). */
int dm_model_name(const dm_options *o, char *buf, size_t size);
void dm_options_free(dm_options *o);

#endif
