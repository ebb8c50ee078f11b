/* compile.h: the passes of DESIGN.md in order, from a parsed program to the plans code
 * generation and --explain read. The driver runs it once; the planner (plan.h) runs it for
 * every plan it compares. */
#ifndef DM_COMPILE_H
#define DM_COMPILE_H

#include "ast.h"
#include "lower.h"
#include "passes.h"

typedef struct dm_compile_request {
    const dm_lower_options *lower;
    const dm_pipeline_options *pipeline;
    int64_t bucket_floats;      /* the largest gradient bucket (0: DM_BUCKET_FLOATS) */
    const char *target;         /* the code generation target whose scratch is planned ("c", "cuda") */
    const char *stop_after;     /* NULL, or lower | autodiff | optimizer | shard: stop there */
    int plan_memory;            /* plan memory, buckets and ZeRO after the passes */
    int precision_given;        /* pipeline->cost.precision is --precision's, over the program's */
    int no_fuse_casts;          /* --no-fuse-casts: each 16-bit cast a loop of its own */
    double loss_scale;          /* fp16: the initial loss scale (0: 65536, GradScaler's) */
    int64_t loss_scale_interval; /* fp16: clean steps before the scale doubles (0: 2000) */
    ir_prune prune;             /* --prune (ratio 0: none) */
    int quantize_bits;          /* --quantize: 8, 4, or 0 (the code generator's option, for --explain) */
    int64_t quantize_group;     /* int4-weights: rows per scale */
    int quantize_activations;   /* --quantize int8 */
    int quantize_embeddings;    /* --quantize-embeddings */
    double distill_temperature; /* > 0: the loss becomes distillation's (passes/distill.c) */
    double distill_alpha;       /* with distill_temperature: the cross-entropy's weight */
    dm_compaction *compact;     /* --compact: the pruned file in, the compacted weights out; or NULL */
} dm_compile_request;

typedef struct dm_compiled {
    ir_graph *g;                /* NULL when lowering failed */
    dm_reshard_list reshards;
    dm_pipeline_plan pipeline;
    dm_memory_plan memory;      /* when planned */
    dm_bias_plan bias;          /* the bias adds activations complete (for the target) */
    dm_bucket_plan buckets;
    dm_zero_plan zero;
    dm_compress_plan compress;
    int planned;
} dm_compiled;

/* Returns 0, or the errors reported to d (out is still freed by dm_compiled_free). */
int dm_compile(const dm_program *prog, const dm_compile_request *req, dm_diag *d, dm_compiled *out);
/* dm_compile in two parts, for the planner: the program lowered and differentiated (NULL
 * with errors reported to d), which ZeRO and recomputation do not change; then the rest of
 * the passes on that graph or a copy of it (ir_graph_copy), the two choices set in it
 * (dm_lower_set_choices): out owns g from then on. The target ("c", "cuda") decides the
 * fused attention's layout (codegen_attention_heads_inner, codegen_attention_kv_groups). */
ir_graph *dm_lower_differentiated(const dm_program *prog, const dm_lower_options *lower, const char *target,
                                  dm_diag *d);
int dm_compile_differentiated(ir_graph *g, const dm_compile_request *req, dm_diag *d, dm_compiled *out);
void dm_compiled_free(dm_compiled *c);

/* The most one rank allocates, over the pipeline stages (what --explain prints as the
 * peak); requires a planned compile. */
int64_t dm_compiled_peak_bytes(const dm_compiled *c);

#endif
