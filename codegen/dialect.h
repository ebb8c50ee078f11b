/* dialect.h: how a target spells kernels. The emitter (emit.c) decides what to emit,
 * with buffers named and shapes resolved; a dialect turns each kernel description into
 * source text. The C dialect is dialect_c.c; a CUDA dialect implements the same hooks. */
#ifndef DM_DIALECT_H
#define DM_DIALECT_H

#include <stdint.h>
#include <stdio.h>

#include "codegen.h"
#include "ir.h"

/* Output is written in two sections: file-scope code the host functions call (CUDA
 * kernels; empty for C) and the host functions themselves. A dialect's kernel hook
 * writes a launch (or a loop) into w and, where it needs one, a kernel into w->kernels.
 * The emitter concatenates the file as: preamble, kernels, host functions. */
typedef struct cg_writer {
    FILE *f;
    int indent;
    struct cg_writer *kernels;   /* the file-scope section (never NULL while emitting) */
    int serial;                  /* the dialect's counter: unique kernel names within a file */
    void *dialect_state;         /* the dialect's own, per file, on the kernels writer (CUDA: the
                                  * kernels written so far, to reuse); freed by the dialect's
                                  * finish hook; NULL at first (writers start zeroed) */
    unsigned c_helpers;          /* the C dialect's file-scope helpers written so far, a bit each,
                                  * on the kernels writer: apart from dialect_state, since the C
                                  * dialect's loops also run in other dialects' files (parameter
                                  * servers' updates in a CUDA program) */
} cg_writer;

void cg_line(cg_writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_blank(cg_writer *w);

/* out[...] (=|+=) expr over a loop nest. Operand k is named in expr by var[k] ("x",
 * "a", ...); its element at the loop position is at[k] + sum_d index_d * stride[k][d],
 * or the literal constant[k] when that is set. Dims are coalesced already. */
#define CG_MAX_OPERANDS 4
typedef struct cg_loop_nest {
    int rank;
    int64_t size[IR_MAX_RANK];                      /* (rank) */
    int n_in;
    const char *var[CG_MAX_OPERANDS];
    const char *buffer[CG_MAX_OPERANDS];            /* C name of the operand buffer */
    const char *constant[CG_MAX_OPERANDS];          /* C literal, or NULL */
    int64_t stride[CG_MAX_OPERANDS][IR_MAX_RANK];   /* (n_in, rank) */
    int64_t offset[CG_MAX_OPERANDS];                /* (n_in) element of operand k at index 0 */
    const char *out;
    int64_t out_stride[IR_MAX_RANK];                /* (rank) */
    int64_t out_offset;
    int64_t out_elems;                              /* elements of out (zeroed first when accumulating) */
    const char *expr;
    int accumulate;
    const char *scale;                              /* multiply out by this literal afterwards, or NULL */
    const char *also_out;                           /* can.bias_activation: the first local of expr
                                                     * is also stored there, at out's index (not
                                                     * accumulated), or NULL */
    const char *cast_out;                           /* can.fused_cast: out's value is also stored
                                                     * there rounded to cast_dtype, at out's index
                                                     * (out dense, not accumulated), or NULL */
    ir_dtype cast_dtype;
    int out_unread;                                 /* with cast_out (can.copy_alone): nothing but
                                                     * the cast reads out's f32 value, which is
                                                     * not stored (cg_stores_copy_alone) */
    const char *operand_cast_out;                   /* can.cast_with_sum: operand 0's value is
                                                     * also stored there rounded to cast_dtype,
                                                     * at its index less its offset (a dense copy
                                                     * of operand 0), or NULL */
} cg_loop_nest;

/* Row-major c = op(a) @ op(b) (+ c when accumulate), batch times: the i-th product
 * reads a + i * batch_stride_a and b + i * batch_stride_b and writes c + i * batch_stride_c. */
typedef struct cg_gemm {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    const char *a, *b, *c;
    int accumulate;
    const char *beta;                               /* batch 1, no bias: the beta as a C expression
                                                     * of the run (a product made in its micro-
                                                     * batches' sum: 0 for the first, else 1);
                                                     * NULL: accumulate's */
    const char *bias;                               /* can.gemm_bias, batch 1: c = bias + the product,
                                                     * the bias (n floats) added to every row; NULL */
    const char *bias_grad;                          /* can.gemm_bias_grad, batch 1, op(b) not
                                                     * transposed: also the sums of b's k rows
                                                     * (n floats) stored there; NULL */
    ir_dtype operands;                              /* of a and b: DT_F32, or DT_BF16 or DT_F16
                                                     * (uint16_t bits); c is f32 */
    int64_t batch;                                  /* 1 for a single product */
    int64_t batch_stride_a, batch_stride_b, batch_stride_c;
} cg_gemm;

/* A product's beta as the dialects spell it. */
static inline const char *cg_gemm_beta(const cg_gemm *k) { return k->beta ? k->beta : k->accumulate ? "1.0f" : "0.0f"; }

/* The longest row a layernorm makes in a local array where only its copy is stored
 * (cg_rowwise.out_unread): 64 KiB of the thread's stack. */
#define CG_LOCAL_ROW_MAX 16384

/* A kernel along one dim of a tensor seen as (outer, n, inner): softmax and its
 * gradient work along n; layernorm and its gradients along the last dim (inner 1); the
 * causal mask sees (outer, n queries, inner keys). Unused operands are NULL. */
typedef struct cg_rowwise {
    int64_t outer, n, inner;
    const char *x, *y, *dy, *weight, *bias, *out;
    const char *fill;                               /* causal mask: C literal of masked elements */
    const char *eps;                                /* layernorm: C literal */
    const char *scale;                              /* softmax: C literal the input is multiplied by, or NULL */
    int64_t causal_queries;                         /* softmax: rows are queries cycling through this
                                                     * many, seeing keys up to their own (0: every key) */
    const char *scratch;                            /* layernorm_wgrad: wgrad_scratch_floats of the
                                                     * context's storage, or NULL when that is 0 */
    const char *bias_grad_out;                      /* layernorm_wgrad, with can.wgrad_bias: the
                                                     * sum over rows of dy (the bias's gradient)
                                                     * stored there too, or NULL */
    const char *sum_a, *sum_b;                      /* layernorm, with can.residual_norm: x made in
                                                     * the same pass as sum_a + sum_b (a residual
                                                     * add) and stored, or NULL */
    int accumulate;                                 /* layernorm_grad: out += the gradient, element
                                                     * by element (a residual's gradient summed in
                                                     * its buffer: pass_memory's sum_add_of) */
    const char *cast_out;                           /* layernorm and its input gradient, with
                                                     * can.fused_cast_layernorm: out also stored there
                                                     * rounded to cast_dtype, or NULL */
    ir_dtype cast_dtype;
    int out_unread;                                 /* layernorm with cast_out: as cg_loop_nest's
                                                     * (each row made in a local array, n at most
                                                     * CG_LOCAL_ROW_MAX) */
} cg_rowwise;

/* Embedding rows: out (rows, cols) = table[ids[r]] for ids in [0, n); the gradient adds
 * the rows of dy into a zeroed table (n, cols). */
typedef struct cg_embed {
    int64_t rows, n, cols;
    int64_t vocab;                                  /* ids must be in [0, vocab) */
    const char *first_row;                          /* C expression: the id of table row 0 when the
                                                     * table holds a window of the vocabulary (ids
                                                     * outside it give zero rows); NULL: 0, n == vocab */
    const char *table, *ids, *dy, *out;
    int fault_site;                                 /* the forward: the number of its range check
                                                     * (dmrt_fault.site, see fault_check) */
    const char *position_base;                      /* C expression: the position of ids[0] in the
                                                     * step's whole batch, which a fault reports
                                                     * (a rank's block, a micro-batch) */
    const char *scratch;                            /* the gradient: scratch_bytes of it, or NULL */
    const char *accumulate_if;                      /* the gradient: a C condition of the run under
                                                     * which out is added to, not overwritten (a
                                                     * micro-batches' sum made in place: micro > 0);
                                                     * NULL: never */
    int accumulate;                                 /* the gradient: out is always added to */
    const char *qtable;                             /* the forward: a const dmrt_qweight * (C expression)
                                                     * the rows come from, dequantized, when the table
                                                     * is held narrow only (--quantize-embeddings); NULL:
                                                     * table */
    int qslot;                                      /* with qtable: its slot j (ctx->quant[j], and on a
                                                     * separate memory ctx->quant_data[j], quant_scale[j]) */
} cg_embed;

/* Cross-entropy over rows of logits (rows, classes) with i32 targets, as three kernels
 * (ops.def): the rows' statistics (rows, 3): maximum, sum of exp(logit - maximum), the
 * target's logit; the mean loss from the statistics alone; and from the logits and the
 * statistics, dlogits = (softmax - onehot) * dloss / mean_rows. */
typedef struct cg_xent {
    int64_t rows, classes;
    int64_t mean_rows;                              /* the divisor of the mean: rows of every rank */
    const char *logits, *targets;
    const char *stats;                              /* (rows, 3), as above */
    const char *out;                                /* the statistics, the loss or dlogits */
    ir_dtype out_dtype;                             /* dlogits: f32, or the 16-bit type it is made
                                                     * in (can.loss_grad_16bit), each value rounded
                                                     * once from the f32 one */
    const char *dloss;                              /* the gradient: a C literal, or a buffer name whose
                                                     * element 0 is the scalar (dloss_is_buffer) */
    int dloss_is_buffer;
    int fault_site;                                 /* the statistics: the number of its range check */
    const char *position_base;                      /* C expression: the row of targets[0] in the
                                                     * step's whole batch, which a fault reports */
    const char *where;                              /* .dm location, for the collectives' labels */
    /* classes split over ranks (vocabulary-parallel): this rank holds classes
     * [coord * classes, (coord + 1) * classes) of all_classes; the statistics gather the
     * row maxima and reduce the sums over comm */
    int64_t all_classes;                            /* = classes when whole */
    const char *coord;                              /* C expression, this rank's place on the
                                                     * classes' axis; NULL when whole */
    const char *comm;                               /* the statistics over split classes: the
                                                     * axis' communicator; else NULL */
    const char *scratch;                            /* floats of the context's storage, at least
                                                     * xent_scratch_floats(rows, comm_size) */
    int64_t comm_size;
    const char *logits_name;                        /* for the collectives' labels */
} cg_xent;

/* Fused attention over `heads` heads, each a (positions, width) matrix, one after the
 * other (runtime/dmrt_attention.h): the forward reads q, k, v and writes out and lse (a
 * value per position); the backward reads q, k, v, out, lse and dout and writes dq, dk
 * and dv. Unused operands are NULL. */
typedef struct cg_attention {
    int64_t heads, positions, width;
    int64_t inner;                                  /* heads side by side in a row: head h's row t
                                                     * is row ((h / inner) * positions + t) * inner
                                                     * + h % inner (ir_attention_layout); 1 but
                                                     * where the dialect has can.attention_heads_inner */
    int64_t group;                                  /* query heads per k and v head: k, v, dk and dv
                                                     * have heads / group heads, q's head h
                                                     * reading their head h / group (inner 1);
                                                     * 1 but where the dialect has
                                                     * can.attention_kv_groups */
    int causal;                                     /* keys after the query are hidden */
    const char *scale;                              /* C literal the scores are multiplied by */
    const char *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    const char *work;                               /* attention_scratch_floats(heads, positions,
                                                     * width, operands) floats of the context's
                                                     * storage */
    int64_t work_floats;                            /* that count */
    ir_dtype operands;                              /* DT_F32, or where the dialect runs 16-bit
                                                     * attention (can.attention_16bit) and the
                                                     * products are 16-bit, their dtype: the
                                                     * kernel casts (all stay f32 in memory) */
    const char *name;                               /* the attention's .dm name, for messages */
} cg_attention;

/* Dropout (emit_dropout.c): out[local] = x[local] * scale where the element is kept, else 0,
 * for the `count` elements of this rank's block. Its mask is keyed by the element's index in
 * the step's whole tensor (runtime/dmrt_philox.h, dmrt_dropout_index): the block is walked
 * as `levels` loops, level l running size[l] of whole[l] positions, offset by this rank's
 * block (ctx->coord[split_axis[l]] x size[l]) where split_axis[l] >= 0; `first` is a C
 * expression (uint64_t) of the micro-batch's first element. */
typedef struct cg_dropout {
    int levels;
    int64_t size[IR_MAX_RANK], whole[IR_MAX_RANK];  /* (levels) */
    int split_axis[IR_MAX_RANK];                    /* (levels) mesh axis, or -1 */
    int64_t count;
    const char *first;
    const char *x, *out;
    int op;                                         /* the program's dropout number */
    unsigned long long threshold;                   /* dropped below threshold / 2^24 */
    const char *scale;                              /* C literal: 1 / (1 - p) */
} cg_dropout;

typedef struct cg_update {
    const ir_optimizer *opt;
    const char *count;                              /* elements: a C expression (int64_t) */
    const char *param, *grad, *state0, *state1;     /* state NULL when unused */
    const char *updates;                            /* C expression (int64_t): the optimizer's
                                                     * updates, this one counted (AdamW's bias
                                                     * correction, momentum's first); ctx->step
                                                     * but for the steps loss scaling skipped */
} cg_update;

/* A product x @ W of a --quantize program (emit_quant.c): c (m, W's cols) = a (m, W's rows)
 * @ W (+ c when accumulate), W the narrow weight ctx->quant[slot] (a dmrt_qweight, host
 * memory); where the context's storage is separate (separate_memory), its integers and
 * scales are also at ctx->quant_data[slot] and ctx->quant_scale[slot] in that memory, and
 * ctx->quant_work the quant_work_bytes the products need (none when 0). activations: --quantize
 * int8 (int8 x int8), whose calibration multiplies the f32 parameter w_f32. */
typedef struct cg_quant_gemm {
    int slot;
    int activations;
    int64_t m, lda, ldc;
    const char *a, *c, *w_f32;
    const char *b;                                  /* the f32 weight as the phase names it (a local) */
    int accumulate;
    /* cols > 0: the product reads columns [col0, col0 + cols) of the weight's [k, n] alone
     * (a window: passes/quantize.c); 0: the whole */
    int64_t col0, cols;
} cg_quant_gemm;

/* Magnitude pruning after a weight's update (emit_prune.c): weight's n elements whose mask
 * (1.0 where pruned) is mask, in `channels` channels of `inner` elements (runtime/prune.c);
 * the schedule is the file's prune_schedule, the update count the C expression `updates`;
 * name: the parameter's, for the message of a failure. */
typedef struct cg_prune {
    const char *weight, *mask, *updates, *name;
    int64_t n, channels, inner;
} cg_prune;

/* --prune RATIO:rows over an attention's heads (emit_prune_heads.c): the `parts` array of
 * dmrt_prune_part (its n_parts weights and masks) in scope, `units` heads; updates and name
 * as in cg_prune. */
typedef struct cg_prune_heads {
    int n_parts;
    int64_t units;
    const char *updates, *name;
} cg_prune_heads;

typedef enum { CG_HOST_TO_DEVICE, CG_DEVICE_TO_HOST, CG_DEVICE_TO_DEVICE } cg_copy_kind;

/* What a dialect's generated code can do, as data (1: it can). Code generation refuses
 * the rest before it writes anything, and `dmc --check` runs the same refusals
 * (codegen_check), so both say the same. Fused attention is the attention hook's presence. */
typedef struct cg_capabilities {
    int zero;               /* ZeRO's sharded updates (--zero) */
    int interleaved;        /* the interleaved pipeline schedule (--schedule interleaved) */
    int weight_versions;    /* the 2bw and pipedream schedules' weight versions */
    int compress;           /* gradient compression (--compress) */
    int param_servers;      /* parameter servers (--param-servers) */
    int dropout;
    int predict;            /* <model>_predict (else the descriptor says why not) */
    int checkpoints;        /* checkpoints read the optimizer state (else the descriptor says why not) */
    int bias_activation;    /* an activation's loop nest adds a bias and stores the sum too
                             * (cg_loop_nest.also_out: pass_fuse_bias) */
    int bf16, f16;          /* 16-bit product operands (--precision bf16, fp16): the casts'
                             * round_to and cg_gemm.operands */
    int quantize;           /* --quantize's narrow weights and their products (quant_gemm) */
    int narrow_only;        /* int8-weights / int4-weights: a weight only quantized products read keeps no
                             * f32 copy (its products widen it into a buffer of their own, not into it) */
    int flat_update;        /* a serial program's update in one sgd or adamw call over its parameters
                             * laid end to end, where that is the same arithmetic (emit_flat_update.c) */
    int attention_bf16, attention_f16; /* under --precision bf16 (fp16) the fused attention
                             * multiplies in that type (cg_attention.operands; CUDA: cuDNN,
                             * both; C: bf16, its vdpbf16ps tile products); else it stays f32 */
    int attention_heads_inner; /* the attention's kernels take [.., T, H, D] operands (cg_attention.inner
                             * > 1): the heads' split and merge transposes are folded into it */
    int attention_kv_groups; /* the attention's kernels take k and v with fewer heads than q, each
                             * serving cg_attention.group query heads: the fusion folds
                             * grouped-query attention's repeats of k and v into it */
    int gemm_bias;          /* a product with a bias's add starts from the bias's rows itself
                             * (cg_gemm.bias, f32 and bf16 operands): no fill loop before it */
    int gemm_bias_grad;     /* a weight gradient's product sums its bias's gradient, the sum of
                             * its second operand's rows, in the same call (cg_gemm.bias_grad,
                             * f32 operands): the sum's own loop is not written
                             * (emit_bias_grad.c) */
    int fused_cast;         /* loop nests store the 16-bit copy of their result in the same pass
                             * (cg_loop_nest.cast_out): the cast's own loop, which would read the
                             * f32 value again, is not written (emit_fused_cast.c) */
    int fused_cast_layernorm; /* so do layernorm and its input gradient (cg_rowwise.cast_out) */
    int outline_loops;      /* an op's loops are a static function written once a file and called by
                             * every op whose loops are the same (outline_loops.c) */
    int copy_alone;         /* such a kernel stores only the copy where nothing else reads the
                             * f32 value (out_unread; cg_stores_copy_alone): layernorm rows of
                             * at most CG_LOCAL_ROW_MAX made in a local array */
    int cast_with_sum;      /* a loop nest stores its first operand's 16-bit copy as it reads it
                             * (cg_loop_nest.operand_cast_out): a cast followed by the sum of
                             * the same tensor (a bias's gradient) is stored by the sum's pass
                             * (emit_fused_cast.c, cast_summed_with) */
    int loss_grad_16bit;    /* cross_entropy_grad writes 16-bit values (cg_xent.out_dtype) when the
                             * gradient is made in the products' type (passes/precision.c) */
    int residual_norm;      /* layernorm makes the residual add it reads in its own row pass
                             * (cg_rowwise.sum_a, sum_b): the add's loop is not written
                             * (emit_residual_norm.c) */
    int wgrad_bias;         /* layernorm's weight gradient sums its bias's gradient (the sum over
                             * rows of the same dy) in the same pass (cg_rowwise.bias_grad_out):
                             * the bias's own sum_to loop is not written (emit_ops.c) */
} cg_capabilities;

/* A target: data, the hooks for host scaffolding, and one hook per kind of kernel.
 *
 * Conventions of the generated host code the hooks write into: the context is `ctx`
 * (struct_ctx *, see emit.c), with ctx->error (char[512]), ctx->fault (dmrt_fault),
 * ctx->step (int64_t, updates done, this one counted) and ctx->lr (double, this update's
 * learning rate: emit_schedule.c); functions return DMRT_OK or a status. `on_fail` arguments are the statement to run when the spelled call fails
 * ("return device_failed(ctx);", "goto fail;"); a dialect whose calls cannot fail
 * ignores them. Buffer names are C expressions of pointers into the context's storage,
 * which is a memory the host cannot address when separate_memory is set: then host code
 * never dereferences them and goes through copy. */
typedef struct cg_dialect {
    const char *name;               /* --target: "c", "cuda" */
    const char *source_suffix;      /* of the generated file: "c", "cu" */
    int separate_memory;            /* the context's storage is in a memory the host cannot
                                     * address (a GPU's; see above). Then each step copies the
                                     * caller's batch into the context's inputs (ctx->input_<x>),
                                     * which the kernels read; an output's accessor copies it out
                                     * into host memory (ctx->host_output_<x>); parameters are
                                     * drawn, gathered and scattered through host memory. 0: the
                                     * kernels read the caller's batch where it is, the accessors
                                     * return the context's own buffers, and parameters are
                                     * written and read in place */
    int block_alignment;            /* 0: create allocates each buffer of the context's storage
                                     * by itself (alloc) and destroy frees each; n > 0: create
                                     * carves them all, each at a multiple of n bytes, out of one
                                     * allocation (ctx->device_block) that destroy frees: one
                                     * call where allocating is slow. That allocation failing runs
                                     * device_failed(ctx) (ctx_helpers defines it) */
    const char *storage_note;       /* the context struct's comment on its storage, after
                                     * "planned by dmc": "elements of 4 bytes", "device memory" */
    const char *comm_error;         /* C expression: the message of the communicator call that
                                     * just failed (comm_failed copies it into ctx->error) */
    const char *memory_peak;        /* C expression: the bytes the context `c` allocated at most
                                     * in the dialect's memory (dmrt_model.memory_peak) */
    cg_capabilities can;            /* what its generated code can do (above) */
    const char *round_to[DT_F16 + 1]; /* by 16-bit dtype: C expression of float x, its bits in
                                     * that type (uint16_t), rounded to nearest even (the cast
                                     * op's loop nest) */
    codegen_toolchain toolchain;    /* how dmc run builds its source (codegen.h) */

    /* What the public header <model>.h says of the target: after the API's opening comment,
     * where the context's storage lives and how the API's host pointers reach it (NULL:
     * nothing to add); the failures create reports besides "out of memory" (a C string
     * fragment: ", \"no CUDA device: ...\"", or ""); a sentence on what set_threads
     * changes ("" or " This target's ..."). */
    void (*header_note)(cg_writer *w, const char *model);
    const char *create_failures;
    const char *threads_note;
    /* After #include "<model>.h": the includes and file-scope declarations the dialect
     * needs (before the context struct). */
    void (*preamble)(cg_writer *w);
    /* Fields of the context struct the dialect needs (a device handle). */
    void (*ctx_fields)(cg_writer *w);
    /* After the context struct: static helpers that take struct_ctx * (for CUDA,
     * device_failed(ctx), which copies the device error into ctx->error). */
    void (*ctx_helpers)(cg_writer *w);
    /* In <model>_create_rank or _create_beside, before any allocation (ctx->rank is set
     * when partitioned; serial, `dmrt_rank *beside` is in scope, NULL or the rank to be
     * placed beside), with the options the dialect reads (tf32: --tf32); and in destroy,
     * after every free. */
    void (*ctx_open)(cg_writer *w, int partitioned, int tf32, const char *on_fail);
    void (*ctx_close)(cg_writer *w);

    /* lhs = zeroed storage of `bytes` (a C expression); lhs NULL on failure (on_fail). */
    void (*alloc)(cg_writer *w, const char *lhs, const char *bytes, const char *on_fail);
    void (*free)(cg_writer *w, const char *ptr);
    /* bytes (a C expression) from src to dst. A host side is host memory of the caller. */
    void (*copy)(cg_writer *w, const char *dst, const char *src, const char *bytes, cg_copy_kind kind,
                 const char *on_fail);
    void (*zero)(cg_writer *w, const char *ptr, const char *bytes, const char *on_fail);
    /* A step without host round trips (emit_step_end.c; NULL: copy, and fault_check at the
     * end of each phase). upload: bytes of the caller's batch src to dst through the
     * context's staging memory at offset, without waiting; upload_reserve: that memory,
     * at create; step_end: the step's one wait, the fault record into fault and the loss
     * (a storage expression; NULL: none) into loss_host, a failure returning
     * device_failed(ctx). The updates (sgd, adamw) skip while the fault record is set. */
    void (*upload)(cg_writer *w, const char *dst, const char *src, const char *bytes, long long offset,
                   const char *on_fail);
    void (*upload_reserve)(cg_writer *w, long long bytes, const char *on_fail);
    void (*step_end)(cg_writer *w, const char *loss, const char *loss_host, const char *fault);
    /* Gradient clipping without a wait (emit_clip.c, a program with step_end; NULL: the
     * norm read back by sum_squares): clip_reserve, at create, room for the squares of
     * `gradients` gradients; clip_squares, gradient slot's squares; clip_factor, the factor
     * clip / (norm + 1e-6) from slots 0..gradients-1 in order, on the device; clip_scale,
     * x *= that factor where it is below 1. */
    void (*clip_reserve)(cg_writer *w, int gradients, const char *on_fail);
    void (*clip_squares)(cg_writer *w, const char *x, const char *count, int slot);
    void (*clip_factor)(cg_writer *w, int gradients, const char *clip);
    void (*clip_scale)(cg_writer *w, const char *x, const char *count);
    /* How a dmrt_comm.h call (op: "allreduce_sum", "allgather", "reduce_scatter_sum",
     * "alltoall", "allreduce_start", "comm_wait", "send", "recv") on the context's
     * buffers is spelled up to its first argument: "dmrt_allreduce_sum(" or
     * "dmrt_gpu_allreduce_sum(ctx->gpu, ". Calls on host memory always use dmrt_comm.h. */
    void (*comm_callee)(char *buf, size_t size, const char *op);
    /* After a kernel with a range check (embed, xent_stats) (end_of_phase 0)
     * and at the end of a phase function that has one (1): the statements that return
     * data_fault(ctx) once ctx->fault.site is set. C checks at once; CUDA once, at the
     * end (it skips bad rows, so nothing before touches memory it should not). */
    void (*fault_check)(cg_writer *w, int end_of_phase);
    /* Scratch the kernels need beyond the collectives' (ctx->scratch, floats): a
     * cross-entropy of rows x classes over comm_size ranks (1: whole); an embedding
     * gradient of rows positions (bytes, in cg_embed.scratch). */
    int64_t (*xent_scratch_floats)(int64_t rows, int64_t comm_size);
    int64_t (*embed_grad_scratch_bytes)(int64_t rows);
    /* ... and a layernorm weight gradient of (rows, n) (floats). */
    int64_t (*wgrad_scratch_floats)(int64_t rows, int64_t n);
    /* ... and either fused attention kernel over heads of (positions, width) with operands
     * of dtype (cg_attention.operands) (floats). NULL, and attention and attention_grad
     * NULL: the target has no fused attention (the driver then leaves the pattern unfused). */
    int64_t (*attention_scratch_floats)(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype);
    void (*loop_nest)(cg_writer *w, const cg_loop_nest *k);
    void (*gemm)(cg_writer *w, const cg_gemm *k);
    void (*xent_stats)(cg_writer *w, const cg_xent *k);
    void (*cross_entropy)(cg_writer *w, const cg_xent *k);
    void (*cross_entropy_grad)(cg_writer *w, const cg_xent *k);
    void (*sgd)(cg_writer *w, const cg_update *k);
    void (*adamw)(cg_writer *w, const cg_update *k);
    /* Gradient clipping (emit_clip.c): the squares of count (a C expression) floats from x
     * added to the host double `sum`; x's count floats multiplied by the host float `factor`. */
    void (*sum_squares)(cg_writer *w, const char *x, const char *count, const char *sum);
    void (*scale)(cg_writer *w, const char *x, const char *count, const char *factor);
    /* dmrt_prune's work on the context's buffers (cg_prune). NULL: the target cannot prune. */
    void (*prune)(cg_writer *w, const cg_prune *k);
    /* dmrt_prune_heads on the parts (cg_prune_heads). NULL: the target does not prune heads. */
    void (*prune_heads)(cg_writer *w, const cg_prune_heads *k);
    void (*softmax)(cg_writer *w, const cg_rowwise *k);
    void (*softmax_grad)(cg_writer *w, const cg_rowwise *k);
    void (*causal_mask)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm_grad)(cg_writer *w, const cg_rowwise *k);
    void (*layernorm_wgrad)(cg_writer *w, const cg_rowwise *k);
    void (*embed)(cg_writer *w, const cg_embed *k);
    void (*embed_grad)(cg_writer *w, const cg_embed *k);
    void (*dropout)(cg_writer *w, const cg_dropout *k);
    void (*attention)(cg_writer *w, const cg_attention *k);
    void (*attention_grad)(cg_writer *w, const cg_attention *k);
    /* --quantize (can.quantize): the product above; and the bytes of work memory a product
     * of m rows by a [rows, cols] weight needs (ctx->quant_work, the largest of them), NULL
     * when none. */
    void (*quant_gemm)(cg_writer *w, const cg_quant_gemm *k);
    int64_t (*quant_work_bytes)(int activations, int64_t m, int64_t rows, int64_t cols);
    /* After the last hook of a file (w: its host writer): frees what the dialect keeps in
     * w->kernels->dialect_state. NULL: nothing to do. */
    void (*finish)(cg_writer *w);
} cg_dialect;

/* The runtime's rounding of a float to a 16-bit dtype's bits (runtime/dmrt_half.h, for C
 * and CUDA code alike): what a folded cast (cast_out) calls. */
static inline const char *cg_round_function(ir_dtype dtype) { return dtype == DT_F16 ? "dmrt_f16_round" : "dmrt_bf16_round"; }

extern const cg_dialect cg_dialect_c;
extern const cg_dialect cg_dialect_cuda;
/* Whether the CUDA dialect splits this nest's sum into chunks (then its results differ
 * from the C dialect's by rounding; for tests/tools/cuda_dialect_smoke.c). */
int cg_cuda_sum_is_split(const cg_loop_nest *k);

/* The dialect named by --target, or NULL. */
const cg_dialect *cg_dialect_find(const char *name);

/* A float as a C literal ("0.5f", "1e-08f"). */
void cg_float_literal(double v, char *buf, size_t size);

/* AdamW as torch.optim.AdamW computes it, shared by every dialect: the literals of beta1,
 * 1 - beta1, beta2, 1 - beta2 and eps, and (written to w) the declarations of this step's
 * decay = 1 - lr * wd, step_size = lr / (1 - beta1^step) and bc2_sqrt = sqrt(1 - beta2^step),
 * each computed in double and rounded to float once. */
typedef struct cg_adamw_literals {
    char beta1[64], one_minus_beta1[64], beta2[64], one_minus_beta2[64], eps[64];
} cg_adamw_literals;
void cg_adamw_prologue(cg_writer *w, const cg_update *k, cg_adamw_literals *lit);
/* The literals alone (no prologue written). */
void cg_adamw_literals_of(const ir_optimizer *o, cg_adamw_literals *lit);

/* The CUDA dialect's step hooks (dialect_cuda_step.c). */
void cuda_upload(cg_writer *w, const char *dst, const char *src, const char *bytes, long long offset, const char *on_fail);
void cuda_upload_reserve(cg_writer *w, long long bytes, const char *on_fail);
void cuda_step_end(cg_writer *w, const char *loss, const char *loss_host, const char *fault);
void cuda_clip_reserve(cg_writer *w, int gradients, const char *on_fail);
void cuda_clip_squares(cg_writer *w, const char *x, const char *count, int slot);
void cuda_clip_factor(cg_writer *w, int gradients, const char *clip);
void cuda_clip_scale(cg_writer *w, const char *x, const char *count);

#endif
