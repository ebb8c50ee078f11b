/* lower.h: from the syntax tree to the IR's forward graph. Resolves names, evaluates
 * dimension expressions (with command-line overrides), instantiates blocks and layers,
 * and types every value through the shape rules. */
#ifndef DM_LOWER_H
#define DM_LOWER_H

#include "ast.h"
#include "ir.h"

/* A NAME=VALUE override from the command line (--set, --mesh). */
typedef struct dm_override {
    const char *name;
    int64_t value;
    int used;        /* set by lowering when the name was found */
} dm_override;

typedef struct dm_lower_options {
    const char *model;          /* symbol prefix, a C identifier */
    dm_override *dims;          /* (n_dims) --set */
    int n_dims;
    dm_override *mesh;          /* (n_mesh) --mesh */
    int n_mesh;
    int microbatches;           /* --microbatches (--accumulate), 0: the program's */
    int schedule;               /* --schedule as a pipe_kind, -1: the program's */
    int chunks;                 /* --chunks (interleaved), 0: the program's */
    int zero;                   /* --zero as a stage (0 turns it off), -1: the program's */
    int recompute;              /* --recompute as an ir_recompute; RECOMPUTE_MARKED: the program's */
    int fuse_attention;         /* fuse the attention pattern (passes/fuse_attention.c): the C target's
                                 * default, off with --no-fuse-attention */
    int constants_every_step;   /* --no-hoist-constants (ir_graph.constants_every_step) */
    ir_compress compress;       /* --compress: of the data axis's gradient allreduces */
    int sequence_parallel;      /* --sequence-parallel (ir_graph.sequence_parallel) */
    ir_param_servers param_servers; /* --param-servers, --ps-staleness */
    int stop_at_error;          /* stop at the first top-level statement with an error: the
                                 * caller only asks whether the program lowers (the planner) */
} dm_lower_options;

/* Returns the forward graph, or NULL with errors reported to d. Overrides whose name
 * is not a dimension (or mesh axis) of the program are errors too. */
ir_graph *dm_lower(const dm_program *prog, const dm_lower_options *opts, dm_diag *d);
/* The options only the passes after autodiff read (the ZeRO stage, the recomputation,
 * compression, sequence parallelism), set in g as dm_lower sets them: a graph lowered with other such options then compiles as
 * if lowered with these (with opts->zero < 0 it keeps the stage it has, not the program's). */
void dm_lower_set_choices(ir_graph *g, const dm_lower_options *opts);

#endif
