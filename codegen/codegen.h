/* codegen.h: writes DIR/<model>.h and DIR/<model>.<c|cu> for a planned graph, in the
 * dialect the target names (C for CPUs, CUDA for NVIDIA GPUs). Codegen plans nothing:
 * the memory plan, the pipeline's stages and schedule and the gradient buckets come from
 * passes. */
#ifndef DM_CODEGEN_H
#define DM_CODEGEN_H

#include <stdio.h>

#include "ir.h"
#include "passes.h"

/* Choices of the generated code that the graph does not fix. */
typedef struct codegen_options {
    const char *target;   /* "c" (NULL: the default) or "cuda" */
    int tf32;             /* cuda: matrix products may use TF32 tensor cores */
    int quantize_bits;    /* --quantize int8-weights (8), int4-weights (4); 0: f32 weights */
    int64_t quantize_group; /* int4-weights: rows of a weight per scale (default 64) */
    int quantize_activations; /* --quantize int8: the products' inputs int8 too (bits 8) */
} codegen_options;

/* What the passes decided, for code generation to spell. pipeline must have its readers
 * (pipeline_plan_readers); memory its scratch_elems for this target (dm_scratch_elems
 * with codegen_scratch_rules). */
typedef struct codegen_plans {
    const dm_memory_plan *memory;
    const dm_pipeline_plan *pipeline;
    const dm_bucket_plan *buckets;
    const dm_zero_plan *zero;       /* NULL: no ZeRO */
    const dm_compress_plan *compress; /* NULL: no gradient compression */
    const dm_bias_plan *bias;       /* pass_fuse_bias's; NULL: every bias is added by its product */
} codegen_plans;

/* How `dmc run` builds a target's generated source into a program (driver/toolchain.c
 * spells the commands): the C compiler always compiles main.c and links it with the
 * runtime; a target with a compiler of its own has it compile the source into an object
 * first (with the flags and architecture the build gave the toolkit's runtime library). */
typedef struct codegen_toolchain {
    const char *compiler;       /* the source's own compiler ("nvcc"), or NULL: the C compiler
                                 * compiles it with main.c */
    const char *compiler_env;   /* the environment variable that names its path ("NVCC") */
    const char *toolkit;        /* where the compiler and libraries come from, for messages ("CUDA") */
    const char *libraries;      /* what the program links besides the runtime, before it, or "" */
    int toolkit_libs;           /* the libraries are in the toolkit's lib64 (-L and -rpath) */
    int tf32;                   /* --tf32 reaches the generated code (matrix products in TF32) */
} codegen_toolchain;

/* Whether name is a target codegen knows ("c", "cuda"). */
int codegen_target_known(const char *name);
/* Whether the target has fused attention kernels (passes/fuse_attention.c): C does. */
int codegen_fuses_attention(const char *target);
/* Whether the target's attention kernels take heads side by side in a row ([.., T, H, D],
 * cg_attention.inner), so that the fusion folds the heads' transposes in: C's do. */
int codegen_attention_heads_inner(const char *target);
/* Whether the target's attention kernels take k and v with fewer heads than q
 * (grouped-query attention, cg_attention.group), so that the fusion folds repeat_kv's
 * copies in: C's do. */
int codegen_attention_kv_groups(const char *target);
/* Whether the target runs fused attention's products in `dtype` (DT_BF16, DT_F16) under
 * that --precision (CUDA: cuDNN, both; C: bf16); else the attention stays f32. */
int codegen_attention_16bit(const char *target, ir_dtype dtype);
/* Whether the target's kernels store a 16-bit copy of what they write, in the same pass
 * (cg_capabilities.fused_cast; passes/precision.c then places casts after their operand's op). */
int codegen_fuses_casts(const char *target);
/* Whether the target's layernorm makes the residual add it reads next in its own row pass
 * (cg_capabilities.residual_norm; the memory plan then keeps the add's operands alive to it). */
int codegen_residual_norms(const char *target);
/* Whether the target's cross-entropy gradient writes 16-bit values itself
 * (cg_capabilities.loss_grad_16bit; passes/precision.c then makes it in the products' type). */
int codegen_loss_grad_16bit(const char *target);
/* Whether the target's activations can add a bias in their own pass (pass_fuse_bias): C's can. */
int codegen_fuses_bias(const char *target);
/* Whether the target updates a serial program's parameters in one launch where it can
 * (emit_flat_update.c), its gradients and optimizer state then laid out as its parameters (memory_update_layout): CUDA's does. */
int codegen_flat_update(const char *target);
/* Whether --quantize int8-weights / int4-weights keeps a weight that only quantized products
 * read narrow only, without its f32 copy (cg_capabilities.narrow_only): C's does. */
int codegen_narrow_only(const char *target);
/* The scratch the target's kernels need (dm_scratch_elems), for --explain's prediction. */
void codegen_scratch_rules(const char *target, dm_scratch_rules *out);
/* The target's toolchain (NULL: the default target's). */
const codegen_toolchain *codegen_toolchain_of(const char *target);
/* "c" or "cu": the suffix of the generated source for the target. */
const char *codegen_source_suffix(const char *target);

/* What codegen_write refuses before it writes anything (techniques the target's dialect
 * cannot do yet, cg_capabilities; what generated code does not handle), with the same
 * messages: `dmc --check` runs it, so that it agrees with -o. 0, or -1 with the messages on
 * err. */
int codegen_check(const ir_graph *g, const codegen_plans *plans, const char *source_path, const codegen_options *options,
                  FILE *err);

/* source_path is the .dm file (quoted in comments), source_text its contents (each op
 * gets its .dm line as a comment); options may be NULL (the defaults). Returns 0, or -1
 * with a message on err. Files are written atomically (temporary name, then rename). */
int codegen_write(const ir_graph *g, const codegen_plans *plans, const char *source_path,
                  const char *source_text, size_t source_len, const codegen_options *options,
                  const char *out_dir, FILE *err);

#endif
