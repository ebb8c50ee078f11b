/* ir.h: the dmc IR. One graph per program: the forward ops in source order, then (after
 * passes/autodiff) the backward ops, then (after passes/optimizer) the updates. Every
 * value has exactly one defining op, so values and ops are the same nodes. Operands
 * always come earlier in the list: list order is a valid execution order. */
#ifndef DM_IR_H
#define DM_IR_H

#include <stdint.h>
#include <stdio.h>

#include "diag.h"

typedef enum ir_op {
#define OP(id, name, arity, cls, shard, fwd, bwd) OP_##id,
#include "ops.def"
#undef OP
    OP_COUNT
} ir_op;

typedef enum ir_op_class {
    OPC_SOURCE, OPC_UNARY, OPC_UNARY_GRAD, OPC_BINARY, OPC_REDUCE, OPC_BROADCAST,
    OPC_RESHAPE, OPC_TRANSPOSE, OPC_MATMUL, OPC_LOSS, OPC_LOSS_GRAD, OPC_UPDATE,
    OPC_SOFTMAX, OPC_MASK, OPC_NORM, OPC_SLICE, OPC_GATHER, OPC_COLLECTIVE, OPC_ATTENTION, OPC_VIEW, OPC_CAST,
} ir_op_class;

/* How an op may be partitioned over a mesh axis (the rule the sharding pass applies;
 * only recorded so far: every op runs unpartitioned).
 *   SOURCE       the sharding is declared (input, param) or follows its user.
 *   ELEMENTWISE  any dim may be split, the same way in operands and result; a size-1
 *                (broadcast) dim of an operand stays whole.
 *   REDUCE       kept dims keep their split; a split reduced dim leaves the result
 *                partial over that axis (an allreduce or reduce-scatter completes it).
 *   LAYOUT       reshape, transpose, slice: a split moves with its dim when the dim
 *                survives whole; otherwise the operand is gathered first.
 *   CONTRACT     matmul: batch and row dims of a and column dims of b carry their
 *                split to the result; a split contracting dim makes it partial.
 *   ROWWISE      softmax, layernorm, cross-entropy, masks: any dim but the one the op
 *                works along may be split; that one must be whole (or the op needs
 *                its own collective: cross-entropy over a split vocabulary).
 *   GATHER       embedding: ids split like the result's leading dims; a table split
 *                over its rows (vocabulary) gives a partial result.
 *   ATTENTION    fused attention and its backward: the (batch, head) dims split alike in
 *                every operand; positions and the head's width whole.
 *   COLLECTIVE   inserted by the sharding pass: the op is the change of sharding. */
typedef enum ir_shard_rule {
    SHARD_SOURCE, SHARD_ELEMENTWISE, SHARD_REDUCE, SHARD_LAYOUT, SHARD_CONTRACT, SHARD_ROWWISE, SHARD_GATHER,
    SHARD_COLLECTIVE, SHARD_ATTENTION,
} ir_shard_rule;

typedef struct ir_op_info {
    const char *name;
    int arity;              /* -1: variadic */
    ir_op_class cls;
    ir_shard_rule shard;
    const char *forward;    /* elementwise C expression, or NULL */
    const char *backward;   /* elementwise C expression of the gradient, or NULL */
} ir_op_info;

const ir_op_info *ir_op_info_of(ir_op op);
/* OP_COUNT when no op has that name. */
ir_op ir_op_by_name(const char *name);

/* DT_BF16: bfloat16, the upper half of an f32 (rounded to nearest even); DT_F16: IEEE
 * binary16. Both are stored in 2 bytes, and only a matrix product's operands have them
 * (passes/precision.c). */
typedef enum ir_dtype { DT_F32, DT_I32, DT_VOID, DT_BF16, DT_F16 } ir_dtype;
const char *ir_dtype_name(ir_dtype t);
/* Bytes of one element (0 for void). */
int ir_dtype_bytes(ir_dtype t);
/* A 16-bit floating-point type (bf16, f16). */
int ir_dtype_is_half(ir_dtype t);

#define IR_MAX_RANK 8
#define IR_MAX_AXES 8
#define IR_REPLICATED (-1)

/* dtype, shape with named dims, and sharding over the mesh. */
typedef struct ir_type {
    ir_dtype dtype;
    int rank;
    int64_t shape[IR_MAX_RANK];        /* (rank) */
    const char *dim_name[IR_MAX_RANK]; /* (rank) the dimension constant, or NULL */
    int8_t split[IR_MAX_RANK];         /* (rank) mesh axis splitting the dim, or IR_REPLICATED */
    uint32_t partial;                  /* mesh axes over which a sum is pending (bit per axis) */
} ir_type;

/* The elements one tensor may have: far above any real model, low enough that a tensor's
 * bytes and every product of sizes the passes form stay inside int64. Declared types
 * (ir/lower.c), reshape (ir/lower_builtins.c) and every value shapes_infer types are held
 * to it. */
#define IR_MAX_NUMEL ((int64_t)1 << 40)

/* The product of t's sizes; INT64_MAX when it overflows (a type shapes_infer has passed
 * is at most IR_MAX_NUMEL). */
int64_t ir_numel(const ir_type *t);
/* Whether a and b are the same type: dtype, shape, splits and pending sums (dim names aside). */
int ir_same_type(const ir_type *a, const ir_type *b);

typedef enum ir_init_kind { INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_UNIFORM, INIT_XAVIER } ir_init_kind;

typedef struct ir_init {
    ir_init_kind kind;
    double a, b;        /* normal: mean, std; uniform: lo, hi */
} ir_init;

typedef enum ir_optimizer_kind { OPTIM_NONE, OPTIM_SGD, OPTIM_ADAMW } ir_optimizer_kind;

/* How the learning rate falls after the warmup (docs/language.md, "Schedules and clipping"). */
typedef enum ir_decay { DECAY_NONE, DECAY_COSINE, DECAY_LINEAR } ir_decay;

/* Hyper-parameters, named and defaulted as torch.optim.SGD / torch.optim.AdamW; the
 * schedule and clipping are either's. */
typedef struct ir_optimizer {
    ir_optimizer_kind kind;
    double lr;                                /* the peak: after the warmup, before the decay */
    double momentum, dampening, weight_decay; /* sgd (weight_decay also adamw) */
    int nesterov;
    double beta1, beta2, eps;                 /* adamw */
    double warmup;                            /* steps of linear warmup (an integer), 0: none */
    ir_decay decay;                           /* over the run's total steps, after the warmup */
    double min_lr;                            /* where the decay ends */
    double clip;                              /* clip_grad_norm_'s max_norm, 0: no clipping */
    int no_decay_1d;                          /* weight_decay_1d = false: no weight decay on the
                                               * parameters of one dim in weight files (biases,
                                               * norms' weights), nanoGPT's groups */
    dm_loc loc;
} ir_optimizer;

typedef enum ir_role {
    ROLE_TEMP,       /* lives inside one step, in the arena */
    ROLE_INPUT,      /* read from the caller's buffer */
    ROLE_PARAM,      /* persistent, saved and loaded */
    ROLE_GRAD,       /* persistent gradient of a parameter */
    ROLE_STATE,      /* persistent optimizer state */
    ROLE_CONST,      /* a scalar spelled inline */
} ir_role;

typedef enum ir_phase { PHASE_FORWARD, PHASE_BACKWARD, PHASE_UPDATE } ir_phase;

typedef enum ir_recompute { RECOMPUTE_MARKED, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, RECOMPUTE_NONE } ir_recompute;

/* Gradient compression of data parallelism's gradient allreduces (passes/compress.c):
 * 16-bit values on the wire, top-k sparsification or PowerSGD, the last two with error
 * feedback. */
/* Parameter servers (--param-servers S, docs/parallelism.md): data parallelism whose
 * gradient allreduce and update are done by S ranks outside the mesh, each holding a
 * shard of the parameters and its optimizer state (runtime/comm/dmrt_ps.h). */
typedef struct ir_param_servers {
    int servers;    /* 0: none (allreduce data parallelism) */
    int staleness;  /* < 0: synchronous; else asynchronous with this bound (--ps-staleness) */
} ir_param_servers;

typedef enum ir_compress_kind { COMPRESS_NONE, COMPRESS_BF16, COMPRESS_FP16, COMPRESS_TOPK, COMPRESS_POWERSGD } ir_compress_kind;
typedef struct ir_compress {
    ir_compress_kind kind;
    double ratio;             /* top-k: the fraction of each gradient's elements a rank sends */
    int rank;                 /* PowerSGD: the rank of the factors */
} ir_compress;

typedef struct ir_value {
    int id;                   /* index in graph->values */
    ir_op op;
    int n_operands;
    int *operands;            /* (n_operands) ids of earlier values */
    ir_type type;
    const char *name;         /* source-derived name ("h1", "fc1.weight", "d_h1"), or NULL */
    dm_loc loc;               /* the .dm expression it comes from */
    ir_role role;
    ir_phase phase;
    /* attributes, by op */
    double scalar;            /* CONST: value; LAYERNORM*: epsilon; CAUSAL_MASK: fill; SOFTMAX*, ATTENTION*: scale */
    int causal;               /* SOFTMAX*, ATTENTION*: a causal mask fused in (keys after the query get 0) */
    int heads_inner;          /* ATTENTION*: the operands are [.., T, H, D], each position's H heads
                               * side by side as a reshape of [.., T, H * D] leaves them, instead
                               * of [.., T, D] with every head's positions together (no transposes
                               * around the attention: passes/fuse_attention.c) */
    int kv_group;             /* ATTENTION*: grouped-query attention's query heads per key/value
                               * head (k and v have 1/kv_group of q's heads, [.., H / kv_group,
                               * T, D], head h reading k and v's head h / kv_group, as Hugging
                               * Face's repeat_kv, without its copies: passes/fuse_attention.c);
                               * 0 or 1: k and v are q's shape */
    uint32_t axes;            /* SUM, MEAN, SUM_TO: bit per reduced dim of the operand */
    int axis;                 /* SOFTMAX*, SLICE, PAD, collectives: the dim worked along; STATE
                               * (prune_mask): the output channels' dim of its weight */
    int axis2;                /* ALLTOALL: the dim that becomes split */
    int mesh_axis;            /* collectives: the mesh axis communicated over */
    int64_t offset;           /* SLICE, PAD: first element along axis; STACKED_PART: which part */
    int slice_view;           /* SLICE: read where it lies in its operand's buffer, nothing copied
                               * (passes/slice_views.c: a parameter's window, such as gpt.dm's
                               * c_attn q, k and v) */
    int64_t slice_rows_apart; /* SLICE with slice_view: its rows (runs of its last dim) are this
                               * many elements apart in the operand's buffer, read so by the
                               * products it feeds (their lda or ldb); 0: they are adjacent */
    int batch_dims;           /* MATMUL: leading dims shared by a, b and the result */
    int perm[IR_MAX_RANK];    /* TRANSPOSE: result dim i is operand dim perm[i] */
    int trans_a, trans_b;     /* MATMUL */
    ir_op unary;              /* UNARY_GRAD: the forward op */
    int rng_op;               /* DROPOUT: the dropout's number in the forward program (part of
                               * its random key; its gradient and recomputed copies share it) */
    ir_init init;             /* PARAM */
    int stored_rank;          /* PARAM: rank of its shape in weight files, 0 when that is type's */
    int64_t stored_shape[IR_MAX_RANK]; /* (stored_rank) the same elements in the same order */
    int param_index;          /* PARAM, GRAD, STATE: which parameter (else -1) */
    int annotated;            /* sharding written by the user (kept by passes) */
    struct ir_value *origin;  /* backward: the forward op whose gradient rule made it (its
                               * pipeline stage runs it); NULL otherwise */
    int stage;                /* pipeline stage running it (passes/pipeline.c); 0 without one */
    int segment;              /* forward values made by one call of a layer at the top level (a
                               * transformer block): the call's number from 1; 0 elsewhere */
    int marked;               /* made inside recompute(...): its segment is recomputed */
    int recomputed;           /* a forward op's copy made again in the backward pass (passes/recompute.c) */
    int loss_seed;            /* CONST: the loss's gradient seed, 1 (autodiff), which loss
                               * scaling replaces by the scale */
    int prune_mask;           /* STATE: --prune's mask of its parameter (1 where pruned), the last
                               * operand of the update (passes/optimizer.c) */
    int prune_group;          /* prune_mask under RATIO:rows: its attention's heads from 1 (chosen
                               * together with the group's other masks), 0: per channel */
    int64_t prune_unit;       /* prune_group: channels of dim `axis` per head unit */
    int unreached;            /* PARAM: the loss does not depend on it (passes/trainable.c), so,
                               * as torch.optim skips a parameter whose .grad is None, the
                               * optimizer neither updates nor decays it */
    int tied_partial_of;      /* a micro-batch's partial gradient of a tied parameter, made on
                               * a pipeline rank other than its owner's (passes/tied_partials.c):
                               * that parameter's index + 1; its stage sums it over the
                               * micro-batches and sends the sum to the owner once a step.
                               * 0 for every other value */
} ir_value;

/* --prune (docs/compression.md, "Pruning"): magnitude pruning of every weight matrix,
 * its sparsity ramped from 0 to ratio on Zhu and Gupta's cubic schedule between the
 * fractions start and end of the run's updates. ratio 0: none. */
typedef struct ir_prune {
    double ratio;
    double start, end;
    int rows;                 /* RATIO:rows: whole output channels, by their L2 norm */
} ir_prune;

typedef struct ir_mesh_axis {
    const char *name;
    int64_t size;
    dm_loc loc;
} ir_mesh_axis;

typedef struct ir_graph {
    const char *model;        /* the symbol prefix: file name without .dm */
    ir_value **values;        /* (n_values) in execution order */
    int n_values, cap_values;
    int *params;              /* (n_params) PARAM value ids, declaration order */
    int n_params;
    int *inputs;              /* (n_inputs) INPUT value ids */
    int n_inputs;
    int *outputs;             /* (n_outputs) values returned by forward */
    dm_loc *output_locs;      /* (n_outputs) each one's name in its output statement, for messages */
    int n_outputs;
    int loss;                 /* scalar f32 value minimised, or -1 */
    dm_loc loss_loc;          /* the minimize statement */
    int *grads;               /* (n_params) gradient value of each param, -1 before autodiff */
    ir_optimizer optimizer;
    ir_mesh_axis axes[IR_MAX_AXES];
    int n_axes;
    /* The axes' roles, by their names, resolved once at lowering: the passes read these,
     * never the names (each is -1 where the mesh has no such axis; ir_role_axis gives
     * -1 for one of size 1 too) */
    int pipe_axis;            /* the mesh axis named "pipeline" (stages), or -1 */
    int data_axis;            /* the mesh axis named "data" (batch split, ZeRO, compression) */
    int tensor_axis;          /* the mesh axis named "tensor" (Megatron, sequence parallelism) */
    /* A step's batch runs as `microbatches` micro-batches whose gradients are summed
     * (accumulation; the pipeline's micro-batches): the graph is one micro-batch, its
     * batch_dim (the inputs' leading dim) batch_whole / microbatches. */
    int microbatches;         /* 1: the whole batch at once */
    int schedule;             /* pipe_kind (ir/pipe_kind.h): gpipe, 1f1b, interleaved, 2bw, pipedream */
    int chunks;               /* interleaved: model chunks per pipeline stage (virtual stages
                               * per rank); 0 when not given */
    dm_loc chunks_loc;        /* where the program gave them, if it did */
    const char *batch_dim;    /* NULL when microbatches is 1 */
    int64_t batch_whole;
    dm_loc schedule_loc;      /* the schedule or accumulate statement, if any */
    /* ZeRO (passes/zero.c): 1 splits the optimizer state of every parameter whose
     * gradient is allreduced (data parallelism) over that axis, 2 its gradient too. */
    int zero;                 /* 0: off */
    /* Activation recomputation (passes/recompute.c): RECOMPUTE_MARKED recomputes the
     * segments the program marks with recompute(...), FULL every segment, SELECTIVE the
     * cheap ops (not products or collectives) of every segment. */
    int recompute;            /* ir_recompute */
    /* passes/fuse_attention.c: softmax(causal_mask(q @ kT * s)) @ v becomes one attention
     * op (set for the C target unless --no-fuse-attention). */
    int fuse_attention;
    /* The target's attention kernels read and write [.., T, H, D] (cg_attention.inner): the
     * fusion then takes the heads' split and merge transposes in; set by the driver. */
    int attention_heads_inner;
    /* The target's attention kernels take k and v with fewer heads than q, each serving
     * kv_group query heads: the fusion then takes repeat_kv's copies in; set by the driver. */
    int attention_kv_groups;
    /* The target runs each fused attention's products in product_dtype (CUDA: cuDNN, bf16
     * and fp16; C: bf16 tile products), its operands rounded by the kernel, not by
     * passes/precision.c; set by the driver with product_dtype. */
    int attention_16bit;
    /* The target's kernels can store an activation's 16-bit copy as they write it: casts
     * are made right after their operand's op (passes/precision.c); set by the driver. */
    int casts_with_producer;
    /* The target's layernorm makes a residual add it reads right after the add, in its own
     * row pass (codegen/emit_residual_norm.c): the memory plan keeps the add's operands
     * alive to the layernorm; set by the driver. */
    int residual_norms;
    /* The target's cross-entropy gradient can write the products' 16-bit type itself: under
     * --precision bf16/fp16, a classifier gradient that only products read is made in it
     * (passes/precision.c), no f32 copy of the logits' gradient; set by the driver. */
    int loss_grad_16bit;
    /* passes/hoist_constants.c: the values computed from numbers alone are made once, by
     * create, unless this is set (--no-hoist-constants): then in every step, as other ops */
    int constants_every_step;
    /* passes/shard.c (--sequence-parallel): a pending sum over the mesh axis named tensor
     * that an elementwise op completes is reduce-scattered over the rows' last dim (the
     * sequence of a [B, T, C] activation) instead of allreduced, and the ops up to the next
     * tensor-parallel product run on that split (Megatron-LM's sequence parallelism). */
    int sequence_parallel;
    ir_compress compress;     /* of the gradient allreduces over the axis named data */
    /* passes/precision.c: the dtype of matrix products' operands (DT_F32, or DT_BF16 or
     * DT_F16: both operands cast to it, the product accumulated and stored in f32) */
    ir_dtype product_dtype;
    /* Dynamic loss scaling (f16; torch.cuda.amp.GradScaler's rule): the loss's gradient
     * seeded with the scale, the gradients unscaled before the update, a step whose
     * gradients are not all finite skipped and the scale halved, the scale doubled after
     * loss_scale_interval clean steps in a row. loss_scale 0: none. */
    double loss_scale;        /* the initial scale */
    int64_t loss_scale_interval;
    ir_prune prune;           /* --prune: masks in the optimizer state, applied after every update */
    int quantize_bits;        /* --quantize int8-weights (8), int4-weights (4): what --explain sizes; 0: none */
    int64_t quantize_group;   /* int4-weights: rows per scale */
    int quantize_activations; /* --quantize int8: the products' inputs quantized too (int8 x int8) */
    int quantize_embeddings;  /* --quantize-embeddings: embedding tables narrow too (passes/quantize.c) */
    /* The target keeps a weight whose every reader is a quantized product narrow only, with
     * no f32 copy (dm_weight_held_narrow); set by the driver for int8-weights and int4-weights
     * on a target that can (cg_capabilities.narrow_only). */
    int quantize_narrow_only;
    dm_loc precision_loc;     /* the precision statement, if any */
    ir_param_servers param_servers; /* --param-servers: servers 0 for none */
    dm_loc zero_loc;          /* the zero statement, if any */
    struct ir_value **cut_after; /* (n_cuts) `schedule ...(cuts = [h1, h2])`: stage k + 1
                               * starts after cut_after[k]; NULL: dmc chooses */
    int n_cuts;
    dm_loc cuts_loc;
    /* named dimension constants, after --set overrides, for printing and explain */
    const char **dim_names;   /* (n_dims) */
    int64_t *dim_values;      /* (n_dims) */
    int n_dims;
    struct ir_chunk *arena;   /* the values, their operand lists and the strings (ir.c) */
} ir_graph;

ir_graph *ir_graph_new(const char *model);
void ir_graph_free(ir_graph *g);
/* A copy of g whose values and lists are its own but whose strings (names, dim names) are
 * g's: g must outlive it. The planner's candidates that differ only in what the later
 * passes read start from copies of one lowered graph. */
ir_graph *ir_graph_copy(const ir_graph *g);
/* A string owned by the graph. */
/* schedule.c: "none", "cosine", "linear"; the decay of a name (-1: none such); the
 * checks of a schedule's settings that span several of them. */
const char *ir_decay_name(ir_decay decay);
int ir_decay_from_name(const char *name, ir_decay *decay);
void ir_check_schedule(const ir_optimizer *o, dm_loc loc, dm_diag *d);

const char *ir_intern(ir_graph *g, const char *s);
const char *ir_internf(ir_graph *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* FNV-1a of a NUL-terminated string, for the hash tables of names. */
unsigned ir_hash_string(const char *s);
/* Makes room for one more item in an array holding count items whose capacity is
 * implied by the count (the next power of two): call before every append; appending n
 * items costs O(n). Aborts when out of memory. */
void *ir_grow(void *array, int count, size_t item_size);

/* Elements of one rank's shard: split dims divided by their mesh axis size. */
int64_t ir_local_numel(const struct ir_graph *g, const ir_type *t);
/* t as one rank holds it: each split dim divided by its mesh axis's size. */
ir_type ir_local_type(const struct ir_graph *g, const ir_type *t);
/* The mesh axis of a pipeline of more than one stage, or -1. */
int ir_pipeline_axis(const struct ir_graph *g);
/* axis (g->data_axis, g->tensor_axis, ...) where it exists and has 2 ranks or more, else -1 */
int ir_role_axis(const struct ir_graph *g, int axis);
/* Whether a step runs as scheduled micro-batches (several of them, or pipeline stages). */
int ir_is_scheduled(const struct ir_graph *g);
/* Ranks of the mesh: the product of its axis sizes (1 without a mesh). */
int64_t ir_mesh_ranks(const struct ir_graph *g);
/* Whether parameter p has one dim (or none) in weight files (its `as` shape, else its
 * type's): a bias, a norm's weight; weight_decay_1d = false exempts those from decay. */
int ir_param_is_1d(const struct ir_graph *g, int p);
/* Whether any value is split or has a pending sum (the program runs partitioned). */
int ir_is_partitioned(const struct ir_graph *g);
/* For cross-entropy's statistics or its gradient over logits whose classes (last dim) are
 * split: the mesh axis splitting them, the op then running vocabulary-parallel (the
 * statistics exchange over it; the gradient only needs its place on it); else
 * IR_REPLICATED. */
int ir_class_split_axis(const struct ir_graph *g, const struct ir_value *v);
/* Elements of 4 bytes in v's buffer on one rank (the unit of every buffer's size and
 * offset): its local type's elements, 2-byte ones counted in pairs, and for an attention
 * also the rows' log-sum-exp kept after its result. */
int64_t ir_storage_elems(const struct ir_graph *g, const struct ir_value *v);
/* An attention's (or its gradient's) operands, q of type q: `heads` heads of `positions`
 * rows of `width`, head h's row t at ((h / inner) * positions + t) * inner + h % inner rows
 * (inner: the heads side by side in a row, 1 unless heads_inner); the positions' dim;
 * group: the query heads per key/value head (k and v have heads / group heads, q's head h
 * reading their head h / group; 1 without grouped-query attention, and with heads_inner). */
typedef struct ir_attention_layout {
    int64_t heads, inner, positions, width, group;
    int positions_dim;
} ir_attention_layout;
ir_attention_layout ir_attention_layout_of(const struct ir_value *v, const ir_type *q);
/* Where a view (attention_lse, stacked_part, a slice_view) starts in its operand's buffer,
 * in elements of one rank's shards; 0 for other ops. */
int64_t ir_view_offset(const struct ir_graph *g, const struct ir_value *v);
/* Whether v is its first operand's buffer (the memory plan gives it none of its own): a
 * temporary reshape or view, or a slice_view. */
int ir_in_operand_buffer(const struct ir_value *v);
/* The elements between the rows (last-dim runs) of value id as its storage holds them:
 * slice_rows_apart of the strided slice_view it is, or is a reshape of (keeping its last
 * dim); else its last dim (rows side by side). */
int64_t ir_rows_apart(const struct ir_graph *g, int id);
/* Whether op v reads operand k: a unary gradient reads only the variables its
 * expression names (relu's gradient needs x and dy, not y); every other op reads all. */
int ir_reads_operand(const struct ir_value *v, int k);

/* Appends a value with the given operands; the type is left for the shape rules
 * (ir/shapes.c) unless the caller sets it. */
ir_value *ir_add(ir_graph *g, ir_op op, const int *operands, int n_operands, dm_loc loc);
void ir_append_id(ir_graph *g, int **list, int *n, int id);
/* Removes the last value (one its maker folded away before anything referenced it). */
void ir_drop_last(ir_graph *g);
/* Appends an existing value (a pass rebuilding the list in a new order); sets its id. */
void ir_append_value(ir_graph *g, ir_value *v);
/* After such a rebuild: the graph's params, grads, inputs, outputs and loss renamed by
 * map (old id -> new id). */
void ir_renumber_lists(ir_graph *g, const int *map);

/* Prints the graph, one value per line, in a stable format (golden tests use it). */
void ir_print(const ir_graph *g, FILE *out);
/* Formats a type as f32[B@data, 1024]{+tensor} into buf. */
void ir_format_type(const ir_graph *g, const ir_type *t, char *buf, size_t size);
/* Formats a type's sizes as f32[H=1024, 3]: each named dim with its value (the sizes
 * after --set, for messages about them). */
void ir_format_sizes(const ir_type *t, char *buf, size_t size);

/* Checks the IR invariants (operand order, arity, types set, roles); prints each
 * broken one to err with the pass name and returns their count. */
int ir_verify(const ir_graph *g, const char *after_pass, FILE *err);

/* shapes.c: sets v->type from its operands and attributes by its op's shape rule.
 * SOURCE, RESHAPE, BROADCAST and SUM_TO values carry their result shape already (set by
 * whoever made them); the rule checks it. Reports a mismatch at v->loc naming the
 * shapes. Lowering types each value as it makes it; passes type the values they add. */
int shapes_infer(ir_graph *g, ir_value *v, dm_diag *d);
/* Runs shapes_infer over every value again: the type/shape check as a pass. */
int pass_shapes(ir_graph *g, dm_diag *d);

#endif
