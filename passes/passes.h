/* passes.h: the passes over the IR, each in its own file with one entry point. Each
 * returns 0 on success, or the number of errors it reported to d. */
#ifndef DM_PASSES_H
#define DM_PASSES_H

#include "ir.h"
#include "schedule.h"

/* trainable.c: whether the lowered program is a training step: not empty, a loss
 * (minimize), an optimizer, and parameters the loss depends on; each error points where
 * the missing statement belongs. A parameter the loss does not reach is a warning and is
 * marked unreached (the optimizer leaves it alone). requires: lower. */
int pass_trainable(ir_graph *g, dm_diag *d);

/* compact_channels.c: --compact PRUNED: the output channels `--prune RATIO:rows` zeroed,
 * removed from the program (docs/compression.md, "Compacting"): a product's weight loses
 * its all-zero columns where they only feed the next product (through a bias add and
 * elementwise activations), its bias the same entries and the next weight the same rows,
 * their constant act(bias) folded into the bias after the next product. */
typedef struct dm_file_tensor {   /* a tensor of the pruned file, as read */
    const char *name;
    int f32;                      /* its dtype is F32 (only those are compacted) */
    int rank;
    int64_t shape[IR_MAX_RANK];
    const float *data;
} dm_file_tensor;
typedef struct dm_weight {        /* a parameter's values after compaction */
    const char *name;
    int rank;
    int64_t shape[IR_MAX_RANK];
    float *data;                  /* owned */
} dm_weight;
typedef struct dm_layer_compaction { /* one product's weight: compacted, or why not */
    const char *weight;
    int weight_id;                /* its value */
    int64_t before, after;        /* its output channels */
    const char *next_weight;      /* compacted: the weight that lost the same rows */
    int folded;                   /* compacted: removed channels' constants went into a bias */
    const char *why_not;          /* NULL when compacted */
    char why[160];
    int heads;                    /* an attention's heads (compact_heads.c): weight is its q weight,
                                   * next_weight its projection's, before/after count heads */
} dm_layer_compaction;
typedef struct dm_compaction {
    const char *path;             /* the pruned file (--compact) */
    const dm_file_tensor *file;   /* (n_file) its tensors */
    int n_file;
    dm_weight *weights;           /* (n_weights) out: every parameter (g->params order) compacted */
    int n_weights;
    dm_layer_compaction *layers;  /* (n_layers) out: every product reading a parameter */
    int n_layers;
    int64_t params_before, params_after; /* out: parameters' elements */
} dm_compaction;
/* requires: lower (before autodiff). Every parameter must be in the file, F32, of its
 * shape; errors name the file and the tensor. */
int pass_compact_channels(ir_graph *g, dm_compaction *c, dm_diag *d);
void dm_compaction_free(dm_compaction *c);
/* compact_heads.c: the all-zero heads of every attention removed (a report line each in
 * c->layers); marks listed[w] for the weights whose heads went. Returns how many attentions
 * lost heads. */
int compact_heads(ir_graph *g, dm_compaction *c, char *listed);

/* fuse_attention.c: with g->fuse_attention, each softmax(causal_mask(q @ kT * s)) @ v whose
 * scores and probabilities nothing else reads becomes one attention op. requires: typed
 * forward graph (before autodiff); renumbers values. */
int pass_fuse_attention(ir_graph *g);
/* Slices of a parameter read in place (passes/slice_views.c): a window that is contiguous
 * in the parameter, or whose rows are read only by products (their lda/ldb), is no copy
 * (slice_view, slice_rows_apart). requires: the final graph (after pass_precision), before
 * pass_memory. Returns how many slices it made views. */
int pass_slice_views(ir_graph *g);
/* Whether slice v is (or, before pass_slice_views runs, will be) read in place: the cost
 * model prices it as no copy from the start (the pipeline's and the plan search's costs). */
int dm_slice_reads_in_place(const ir_graph *g, const ir_value *v);

/* microbatch_loss.c: with micro-batches, refuses a loss that is not a mean over the batch's
 * rows, each made from its own (a sum over the batch, a batch statistic): the step takes
 * the mean of the micro-batches'. requires: lower (the forward graph, before autodiff). */
int pass_microbatch_loss(const ir_graph *g, dm_diag *d);

/* autodiff.c: appends the backward graph of g->loss with respect to every parameter;
 * sets g->grads. requires: typed forward graph, g->loss. */
int pass_autodiff(ir_graph *g, dm_diag *d);

/* distill.c: the loss cross_entropy(logits, targets) replaced by knowledge distillation's
 * alpha * CE + (1 - alpha) * T^2 * KL(softmax(teacher / T) || softmax(logits / T)), the
 * teacher's logits a new last input, teacher_logits. requires: lower (before autodiff). */
int pass_distill(ir_graph *g, double temperature, double alpha, dm_diag *d);
/* The logits of g's loss when it is cross_entropy(logits, targets), else -1. */
int distill_loss_logits(const ir_graph *g);

/* supported.c: refuses, at source locations, what code generation cannot do yet: an
 * input split on a dim other than its leading one, outputs not led by the batch under
 * micro-batches, more than 64 stages, an all-to-all of a rank-8 tensor. requires: shard,
 * pipeline. */
int pass_supported(const ir_graph *g, dm_diag *d);

/* recompute.c: copies of the forward ops whose values the backward reads, for the
 * segments g->recompute selects, placed in the backward pass. requires: autodiff. */
int pass_recompute(ir_graph *g, dm_diag *d);

/* optimizer.c: appends one update op per parameter and its state. requires: autodiff. */
int pass_optimizer(ir_graph *g, dm_diag *d);

/* prune_heads.c: the attentions' heads, the unit of --prune RATIO:rows for their q, k, v
 * and output projection weights (docs/compression.md, "Attention heads"). */
enum { PRUNE_HEAD_MEMBERS = 4 };
typedef struct prune_head_member {
    int param;                /* the weight's value id */
    int axis;                 /* its dim of the heads' channels (q, k, v: output; projection: input) */
    int64_t unit;             /* channels of that dim per unit, consecutive */
} prune_head_member;
typedef struct prune_head_group {
    int attention;            /* the attention's value id (fused op, or the product with v) */
    int64_t units;            /* heads pruned as units: the k/v heads (= q heads without GQA) */
    int64_t q_heads, head_size;
    int split[3], product[3];  /* q, k, v: the reshape into [.., heads, HS], the product before it */
    int merge;                /* the reshape merging the heads, read by the output projection */
    prune_head_member members[PRUNE_HEAD_MEMBERS];
    int n_members;            /* 0 when not recognised */
    const char *why;          /* not recognised: why (its weights stay per channel), else NULL */
} prune_head_group;
/* The single forward op reading v, or NULL when none or several do. */
const ir_value *prune_heads_only_reader(const ir_graph *g, const ir_value *v);
/* Every forward attention, in graph order (*n of them; the caller frees the array). */
prune_head_group *prune_heads_find(const ir_graph *g, int *n);


/* shard.c: completes the sharding of every value from the .dm annotations and inserts
 * the collectives (allreduce, allgather, reduce-scatter, all-to-all, local slice) that
 * consumers need; records each one in log. requires: optimizer; renumbers values. */
typedef struct dm_reshard {
    int value;              /* the collective op's value id, or a cross-entropy (gradient) that
                             * exchanges row maxima and sums inside (split vocabulary) */
    int source_line;        /* .dm line of the value it reshards */
    const char *reason;     /* why its consumer needs another sharding */
} dm_reshard;

typedef struct dm_reshard_list {
    dm_reshard *items;      /* (n) in execution order */
    int n;
} dm_reshard_list;

int pass_shard(ir_graph *g, dm_reshard_list *log, dm_diag *d);
/* With --sequence-parallel (ir_graph.sequence_parallel), the mesh axis named tensor that
 * rows split over between tensor-parallel products; -1 when off or of one rank. */
int dm_sequence_axis(const ir_graph *g);
void dm_reshard_list_free(dm_reshard_list *log);

/* cost.c: the predicted work of one op on one rank (its shard), for choosing pipeline
 * cuts and for --explain, and its time on a described machine (hardware.h). Flops count
 * a multiply-add as 2; bytes are what the op reads and writes. A collective (or the
 * exchanges inside a vocabulary-parallel cross-entropy) also sends bytes over a mesh
 * axis in messages, by ring algorithms. */
typedef struct dm_op_cost {
    double flops;
    double bytes;
    int matmul;             /* a matrix product: its flops run at the precision's peak */
    double calls;           /* kernels it runs (a batched product: one call per matrix) */
    int fp32_master;        /* on the fp32 master weights, their gradients and state (the
                             * update phase): 4-byte elements whatever the precision */
    double sent;            /* bytes this rank sends over mesh axis `axis` (receiving as many) */
    double messages;        /* ... in this many steps, each paying the link's latency */
    int axis;
    int in_cache;           /* its bytes move at the cache's bandwidth (where the hardware
                             * gives one), not the memory's */
} dm_op_cost;

/* The machine and the precision matrix products are costed at. */
typedef struct dm_cost_model {
    const struct dm_hardware *hardware;
    int precision;          /* dm_precision */
    /* (n_axes) the mesh ranks are laid out by, when it is not the graph's: the planner
     * (driver/plan.c) costs a one-stage probe of a pipelined plan on the links the whole
     * mesh would use. NULL: the graph's axes. */
    const int64_t *axis_sizes;
} dm_cost_model;

dm_op_cost cost_of_op(const ir_graph *g, const ir_value *v);
/* Bytes one rank sends in collective (or split cross-entropy) c, by ring algorithms over
 * the n ranks of its axis: an allreduce of S bytes 2 (n - 1) / n S, an all-gather of an
 * S-byte shard (n - 1) S, a reduce-scatter or all-to-all of S bytes (n - 1) / n S; the
 * message count in *messages. */
double cost_collective_sent(const ir_graph *g, const ir_value *c, double *messages);
/* Seconds on the model's machine: the longer of the flops at the peak (the precision's
 * for products) and the bytes at the memory bandwidth, each scaled by its efficiency;
 * plus what it sends, at its axis's link. */
double cost_seconds(const ir_graph *g, const dm_cost_model *m, dm_op_cost c);
/* The share of a working set of `bytes` that stays in cache from one use to the next: a
 * rank's cache (the hardware's cache bytes per device times the devices, cores, it runs
 * on) over the bytes, at most 1; 0 where the hardware gives no cache. */
double cost_cached_share(const ir_graph *g, const dm_cost_model *m, double bytes);
/* The model's machine: its hardware, or the nominal preset when it names none. */
const struct dm_hardware *cost_hardware(const dm_cost_model *m);
/* Seconds to send bytes to a neighbour over mesh axis `axis` (one message). */
double cost_link_seconds(const ir_graph *g, const dm_cost_model *m, int axis, double bytes);
/* The link the ranks of mesh axis `axis` talk over: within a node when the axis and the
 * axes inside it (ranks are laid out with the last axis innermost) fit on one. */
const struct dm_link *cost_axis_link(const ir_graph *g, const dm_cost_model *m, int axis);

/* pipeline.c: assigns every op to a pipeline stage (v->stage). Forward ops are cut into
 * contiguous stages by dynamic programming over their order, balancing each stage's
 * predicted time (its forward ops, their gradients, and receiving its inputs) under a
 * memory limit per rank; or where g->cut_after says. Backward ops run on their origin's
 * stage, updates on their parameter's. requires: shard; runs with no pipeline axis too
 * (everything on stage 0). With the interleaved schedule the cut makes P * v virtual
 * stages (v model chunks per rank): stage k (v->stage) runs on the ranks of pipeline
 * coordinate k mod P, as their chunk k / P. */
typedef struct dm_stage_plan {
    int first, last;            /* value ids of its first and last forward op */
    double seconds;             /* predicted forward + backward time of one micro-batch */
    double forward_seconds, backward_seconds; /* its two parts */
    double send_seconds;        /* how far into its backward the gradient of its inputs leaves
                                 * for the stage before (the weights' gradients follow) */
    double flops;               /* forward + backward of one micro-batch */
    int64_t recv_elems;         /* elements received from earlier stages, per micro-batch */
    int64_t activation_elems;   /* elements of its forward values the backward reads, per micro-batch */
    int64_t param_elems;        /* elements of its parameters (one rank's shards) */
    int in_flight;              /* micro-batches whose activations it holds at once */
} dm_stage_plan;

typedef struct dm_pipeline_plan {
    int stages;                 /* the stages the model is cut into: P, or P * chunks interleaved */
    int ranks;                  /* P: the pipeline axis's size (1 without one) */
    int chunks;                 /* model chunks (stages) per pipeline rank: 1 but interleaved */
    dm_stage_plan *stage;       /* (stages) */
    double imbalance;           /* slowest stage over the mean, >= 1 */
    int by_user;                /* the cuts are the program's (schedule ... cuts = [...]) */
    int *tied;                  /* (n_tied) parameters used on more than one stage: each holds a
                                 * copy, the parameter's own stage (the first) updates it and
                                 * sends the new values to the others */
    uint64_t *tied_on;          /* (n_tied) the stages whose forward ops use it, a bit each */
    int n_tied;
    pipe_schedule schedule;     /* every rank's actions (GPipe, 1F1B, interleaved), as generated
                                 * code runs them */
    pipe_schedule timed;        /* the same timed with each stage's predicted forward and backward
                                 * times (unequal stages); actions NULL without cuts */
    double bubble;              /* its idle fraction of stage-time (pipe_bubble) */
    dm_cost_model cost;         /* what the times assume */
    double update_seconds;      /* the update phase of the slowest stage at it: gradient
                                 * reductions left to the update, and the optimizer */
    double step_seconds;        /* predicted: the timed schedule's makespan + update_seconds */
    double model_flops;         /* per rank and step (the mean over stages): matrix products of
                                 * the forward and backward passes, recomputed copies not counted */
    uint64_t *readers;          /* (n_values) for a buffer's owner (memory plan's storage_of): the
                                 * stages whose ops read it, a bit each (stages <= 64); set by
                                 * pipeline_plan_readers once memory is planned */
} dm_pipeline_plan;

typedef struct dm_pipeline_options {
    double memory_limit_bytes;  /* per rank: parameters, gradients, optimizer state and the
                                 * activations in flight; 0: no limit */
    dm_cost_model cost;         /* the machine the stages are timed on (hardware NULL: nominal) */
    double bucket_bytes;        /* the gradient buckets' size (--bucket-mb; 0: 25 MiB) */
    int microbatches;           /* pipeline_estimate_stages: the plan's (its probe runs one);
                                 * 0: the graph's */
    struct dm_cut_memo *cut_memo; /* pipeline_estimate_stages: the cut searches made before, to
                                 * repeat none (the planner's); NULL: none kept */
} dm_pipeline_options;

/* pipeline_checks.c: the model chunks each pipeline rank holds (1 but interleaved), or -1
 * after reporting why the schedule cannot run (chunks without the interleaved schedule,
 * the interleaved one without 2 or more chunks, micro-batches not in groups of P, more
 * than 64 stages, ZeRO, clipping; 2bw: fewer micro-batches than stages, ZeRO, compression,
 * dropout; pipedream also clipping); and the cuts the program names (schedule ...(cuts =
 * [...])) as the forward positions each stage starts at, boundary (stages + 1) over the
 * n_ops forward ops op[] (value ids): the errors found. */
int pipeline_chunks(const ir_graph *g, int ranks, dm_diag *d);
int pipeline_user_cuts(const ir_graph *g, int n_ops, const int *op, int stages, int chunks, int *boundary, dm_diag *d);
/* The pipedream schedule sends a tied parameter's updates only to the stages after the one
 * updating it (emit_2bw.c): an error at each op reading a parameter on an earlier stage (off
 * the loss path: place_the_rest puts a parameter where its gradient is made, the first op on
 * the loss path reading it). The errors found. */
int pipeline_tied_order(const ir_graph *g, const dm_pipeline_plan *plan, dm_diag *d);
/* A warning when dmc's own cut leaves the slowest stage over 1.5x the mean (at: the
 * pipeline axis's declaration, if any). */
void pipeline_warn_imbalance(const ir_graph *g, const dm_pipeline_plan *plan, dm_loc at, dm_diag *d);

/* tied_partials.c: with several micro-batches a step (GPipe, 1F1B, interleaved), a tied
 * parameter's partial gradient made on a pipeline rank other than its owner's is summed
 * there over the micro-batches and sent once a step (codegen/emit_step.c), not after every
 * micro-batch: its add on the owner's stage is dropped (the owner's own partial becomes
 * the micro-batch gradient) and the partial marked (ir_value.tied_partial_of). requires:
 * pipeline; renumbers values (and the ids in pipe and reshards). Returns the partials
 * marked. */
int pass_tied_partials(ir_graph *g, dm_pipeline_plan *pipe, dm_reshard_list *reshards);

/* The pipeline coordinate of the ranks running stage k. */
static inline int dm_rank_of_stage(const dm_pipeline_plan *plan, int k) { return plan->ranks > 1 ? k % plan->ranks : 0; }

/* Cut searches kept for the next estimates of one plan search (pipeline.c says which). */
typedef struct dm_cut_memo dm_cut_memo;
dm_cut_memo *dm_cut_memo_new(void);
void dm_cut_memo_free(dm_cut_memo *memo);

int pass_pipeline(ir_graph *g, const dm_pipeline_options *opts, dm_pipeline_plan *plan, dm_diag *d);
void dm_pipeline_plan_free(dm_pipeline_plan *plan);

/* The planner's estimate of a deep model (driver/plan.c): the stages of g's forward pass
 * as if its repeated layer, of which g (a one-stage probe) has two instances named
 * "GROUP.0" and "GROUP.1", had `layers` instances, each further one costed as the second.
 * The cut is chosen as pass_pipeline chooses it (no memory limit); per stage, one
 * micro-batch's forward and backward seconds, the update phase, and an estimate of its
 * memory: ZeRO's shares taken over the axis named data. Returns 0, or -1 when the second
 * instance's ops do not all follow the first's, or the cut cannot be made. */
typedef struct dm_stage_estimate {
    int stages;
    double *forward, *backward;   /* (stages) seconds of one micro-batch, receiving included */
    double *send;                 /* (stages) dm_stage_plan.send_seconds */
    double *update;               /* (stages) seconds of the update phase */
    double *state_bytes;          /* (stages) parameters, gradients and optimizer state */
    double *activation_bytes;     /* (stages) kept for the backward pass, per micro-batch in flight */
    double model_flops;           /* products forward and backward of one micro-batch, all stages */
    double probe_activation_bytes;/* what g itself keeps for its backward pass */
} dm_stage_estimate;
int pipeline_estimate_stages(const ir_graph *g, const dm_pipeline_options *opts, const char *group, int64_t layers,
                             int stages, dm_stage_estimate *out);
void dm_stage_estimate_free(dm_stage_estimate *e);

/* Optimizer state tensors per parameter: AdamW keeps two, SGD with momentum one. */
int dm_optimizer_states(const ir_graph *g);
/* Elements a rank keeps per parameter element (the parameter, its gradient, `states`
 * optimizer state tensors) under ZeRO stage `zero` over `shares` ranks: 1 splits the
 * state, 2 the gradient too, 3 the parameter too. */
double dm_state_per_param(int zero, int states, double shares);

/* memory.c: where every value lives during a step. */
typedef enum dm_region {
    REGION_NONE,    /* no storage: constants (spelled inline), update ops */
    REGION_INPUT,   /* the caller's batch buffer */
    REGION_PARAMS,  /* ctx->params */
    REGION_GRADS,   /* ctx->grads */
    REGION_STATE,   /* ctx->state */
    REGION_ARENA,   /* ctx->arena, reused within a step */
} dm_region;

/* The regions of one pipeline stage's ranks (elements). */
typedef struct dm_stage_memory {
    int64_t param_elems, grad_elems, state_elems, arena_elems, arena_unshared_elems;
    int64_t grad_sum_elems;  /* the gradients laid out whole (see sum_offset); 0: grad_elems */
    /* A stage holding several micro-batches at once (in_flight > 1) lays its arena out in two
     * parts: the working buffers, shared by every micro-batch (the stage runs one action at a
     * time), then, from arena_elems - kept_elems, the forward values the backward reads, a
     * copy per micro-batch in flight. held_elems = arena_elems + (in_flight - 1) * kept_elems
     * is what its ranks allocate. kept_elems is 0 for one micro-batch in flight, and
     * arena_elems where a copy of the whole arena per micro-batch takes less. */
    int64_t kept_elems, held_elems;
    int in_flight;
    /* Interleaved, a rank holds its chunks' regions one after the other: where this stage's
     * arena starts in its rank's (the offsets of the plan already count it). */
    int64_t arena_base;
} dm_stage_memory;

typedef struct dm_memory_plan {
    dm_region *region;       /* (n_values) */
    int64_t *offset;         /* (n_values) elements from the start of the region (of the value's
                              * own stage's region, once memory_plan_stages ran) */
    int *storage_of;         /* (n_values) the value whose buffer this one shares (itself, or a reshape's root) */
    int64_t *within;         /* (n_values) where in that buffer it starts: 0, or a param_view's offset */
    int *bias_add_of;        /* (n_values) for a product whose one reader adds a bias to it: that
                              * add, which shares its buffer (the product adds the bias: C
                              * filled with it, beta 1); -1 for every other value */
    int *sum_add_of;         /* (n_values) for a product whose one reader adds it to a value that
                              * dies there (a gradient's sum so far, such as d_ln_1's over q, k
                              * and v): that add. The product runs at the add and accumulates
                              * into that value's buffer in place (beta 1), which it and the
                              * add share; -1 for every other value */
    int *assembled_in;       /* (n_values) the pads and adds of a window assembly, and the pieces
                              * made in its windows (passes/memory_windows.c): its sum, whose
                              * buffer they share; -1 for every other value */
    int64_t *row_stride;     /* (n_values) a product writing its piece into a window whose rows
                              * lie that far apart in the sum (its ldc); 0: its own width */
    char *made_in_sum;       /* (n_values) DM_IN_GRAD_SUM, DM_IN_PARTIAL_SUM: a product made
                              * straight into its micro-batches' sum in grad_sum (beta 0 for
                              * the first micro-batch, 1 after: dm_micro_grads_in_sums),
                              * held nowhere else in a micro-batch's passes (a temporary
                              * has no arena buffer); 0 for every other */
    char *at_create;         /* (n_values) 1: made once by create, not in a step (the step only
                              * reads it): a constant (passes/hoist_constants.c), its buffer in
                              * the arena shared with no step value */
    int64_t param_elems, grad_elems, state_elems, arena_elems;  /* the largest over stages */
    int64_t arena_unshared_elems;  /* what the arena would be without reuse (for --explain) */
    /* pipelines (memory_plan_stages): each stage's ranks hold only its share */
    int stages;              /* 1: one layout for every rank */
    dm_stage_memory *stage;  /* (stages) */
    int ranks;               /* the pipeline's ranks: stages, or stages / chunks interleaved */
    dm_stage_memory *rank;   /* (ranks) what each holds: the sums of its stages' regions */
    int *copy_first;         /* (n_values + 1) copies of value i on stages other than its own
                              * (a tied parameter's, a received value's): entries
                              * [copy_first[i], copy_first[i + 1]) of copy_stage/copy_offset */
    int *copy_stage;
    int64_t *copy_offset;
    int64_t scratch_elems;   /* the target's dm_scratch_elems, set by the caller (explain, codegen) */
    /* ZeRO 2 keeps only shares of gradients in REGION_GRADS (pass_zero): the micro-batches'
     * gradient sums keep the whole layout, where gradient i sits at sum_offset[i] */
    int64_t *sum_offset;     /* (n_values) NULL: offset */
    int64_t grad_sum_elems;  /* 0: grad_elems */
    /* a tied partial's (ir_value.tied_partial_of) sum over the micro-batches: where it sits in
     * its rank's grad_sum, after the gradients' (memory_plan_tied_sums) */
    int64_t *partial_sum_offset; /* (n_values) -1 for every other value; NULL: none */
} dm_memory_plan;

/* Whether cross-entropy gradient v is written over its logits, in their buffer (the
 * logits are read by nothing after it: pass_memory). */
int dm_xent_grad_over_logits(const dm_memory_plan *plan, const ir_value *v);
/* The product add v runs (a bias's add: bias_add_of; a sum's: sum_add_of), or -1. */
int dm_product_run_by(const dm_memory_plan *plan, const ir_value *v);
/* The sum a sum's add adds its product to, whose buffer the add and the product take over
 * (sum_add_of); -1 for any other value. */
int dm_sum_added_to(const dm_memory_plan *plan, const ir_value *add);

/* Window assemblies (passes/memory_windows.c): a sum of pads whose windows, along one
 * dim, tile the tensor (the gradient of a tensor read in slices) is built in the sum's
 * buffer; fills plan->assembled_in, row_stride and the pieces' within. Called by
 * pass_memory after bias_add_of, before buffers are shared; readers (n_values): each
 * value's reads, the loss and outputs counted twice. */
void dm_plan_window_assemblies(const ir_graph *g, const int *readers, dm_memory_plan *plan);
/* Where a window `piece` of `whole`, starting at `offset` along `axis` (local types), lies
 * in whole's buffer: its first element and, as `rows` runs of `cols` elements, row_stride
 * apart (contiguous: rows 1); 0 when the window is laid out otherwise. */
int dm_window_layout(const ir_type *whole, const ir_type *piece, int axis, int64_t offset, int64_t *first, int64_t *rows,
                     int64_t *cols, int64_t *row_stride);
/* The residual add right before layernorm ln that it reads (same phase and stage), which
 * the target's layernorm may make in its own pass (g->residual_norms: the memory plan
 * keeps the add's operands alive to ln; codegen/emit_residual_norm.c decides); else NULL. */
const ir_value *dm_residual_add_of(const ir_graph *g, const ir_value *ln);
/* Whether pad (of an assembly) finds its piece already in its window: nothing to copy. */
int dm_piece_in_place(const dm_memory_plan *plan, const ir_value *pad);

/* hoist_constants.c: plan->at_create (called by pass_memory once storage_of, bias_add_of and
 * assembled_in are set): the values computed from numbers alone (arange, a RoPE table:
 * no input, parameter, state or random draw reaches them; ops with kernels of their own,
 * no collective), but the loss and outputs, those read on another pipeline stage, and
 * those sharing a buffer with a value that is not made at create; none with
 * g->constants_every_step. dm_made_at_create: whether value id is one (0 before the plan). */
void dm_plan_at_create(const ir_graph *g, dm_memory_plan *plan);
/* (n_values) the first rule alone: 1 for the forward values computed from numbers alone by
 * such ops (all 0 with g->constants_every_step); pass_recompute makes none of them again.
 * Free with free(). */
char *dm_constant_values(const ir_graph *g);
int dm_made_at_create(const dm_memory_plan *plan, int id);
/* (n_values) 1 for the buffers (storage roots) made at create that an op of a step reads
 * (the tables the steps use; the rest only feed them at create). Free with free(). */
char *dm_read_by_steps(const ir_graph *g, const dm_memory_plan *plan);

/* Plans persistent buffers in declaration order and the arena by liveness over the
 * whole train step (three placements, the smallest arena kept; outputs and the loss live to the end, reshapes share
 * their operand's buffer, and so does a bias's add its product: bias_add_of). requires:
 * optimizer (or autodiff); breaks nothing. */
int pass_memory(const ir_graph *g, dm_memory_plan *plan);
/* Where g->casts_with_producer: the op just before cast (past reshapes of it, each right
 * after its operand), whose kernel may store the cast's copy as it writes
 * (codegen/emit_fused_cast.c) and whose operands pass_memory keeps alive to the cast; NULL
 * where cast is not a cast right after its operand, or casts are not so placed. */
const ir_value *dm_cast_producer(const ir_graph *g, const ir_value *cast);

/* --quantize (docs/compression.md, quantize.c): the parameter that forward product v reads
 * as its right operand (x @ weight, both f32; or x @ transpose(weight) where every forward
 * reader of the weight is such a product: v->trans_b says which; or x @ a window of
 * weight's columns, below), which a quantized program stores narrow as the product's
 * [k, n] (codegen/emit_quant.c; a weight of more dims as [its first dim, the rest]) and
 * --explain sizes (explain_quant.c); -1 for any other v. */
int dm_quantized_weight_of(const ir_graph *g, const ir_value *v);
/* With --quantize-embeddings: the table forward embedding v gathers, when it is held narrow
 * (a scale per row, the layout of x @ transpose(table)), or -1. */
int dm_quantized_table(const ir_graph *g, const ir_value *v);
/* For such a product: 1 when it reads a window of the weight's columns, [*col0, *col0 +
 * *cols) of its [k, n] (gpt.dm's q, k and v: reshape(slice(c_attn, 1, P, P + 1), [C, C]) of
 * the [C, 3, C] weight, columns P C to (P + 1) C), 0 when it reads the whole (*col0 0, *cols
 * n), -1 when it quantizes none. */
int dm_quantized_window(const ir_graph *g, const ir_value *v, int64_t *col0, int64_t *cols);
/* Whether value id is a slice of a weight that only quantized products read (their column
 * windows): it is no copy (passes/slice_views.c), as they read the narrow weight. */
int dm_quantized_window_view(const ir_graph *g, int id);
/* Whether parameter value w is held narrow only, without an f32 copy: g->quantize_narrow_only
 * and every op reading it a product that quantizes it (a weight something else reads, a
 * penalty in the loss, keeps its f32 copy). */
int dm_weight_held_narrow(const ir_graph *g, int w);
/* fuse_bias.c: the bias adds (bias_add_of) whose first reader, an activation, adds the
 * bias in its own pass instead of the product: activation_of (n_values) is that
 * activation for such an add, -1 for every other value (all -1 unless enabled: the
 * target's loop nests can, codegen_fuses_bias). requires: memory; leaves the graph. */
typedef struct dm_bias_plan {
    int *activation_of;
} dm_bias_plan;
void pass_fuse_bias(const ir_graph *g, const dm_memory_plan *mem, int enabled, dm_bias_plan *plan);
void dm_bias_plan_free(dm_bias_plan *plan);

/* The elements the memory plan allocates a parameter or gradient of numel elements: a
 * multiple of 16, and with ZeRO of every mesh axis's size. */
int64_t dm_persistent_elems(const ir_graph *g, int64_t numel);
void dm_memory_plan_free(dm_memory_plan *plan);
/* The value holding the gradient of parameter p that one micro-batch computes: the
 * operand of the step's allreduce of it, or the gradient itself. */
int dm_micro_grad(const ir_graph *g, int p);
/* Whether that value is a temporary (in the arena), not the gradient buffer itself. */
int dm_micro_grad_is_temporary(const ir_graph *g, int p);
/* (n_values) for a step of several micro-batches: the parameter whose micro-batch gradient
 * value i is, when that is a temporary: the generated code adds it to the step's sum
 * (grad_sum) as soon as it is computed, and after the micro-batches reads the sum, never
 * this value; -1 for every other value. Free with free(). */
int *dm_summed_partials(const ir_graph *g);
/* Gradient accumulation in the product, as Megatron-LM's gradient_accumulation_fusion:
 * (n_params) 1 for each parameter whose micro-batch gradient is a weight-gradient product
 * (f32, not batched) that only the update reads, the micro-batches' gradients summed for
 * one update (not pipedream). With several micro-batches its product then writes the
 * step's sum itself, beta 0 for the first micro-batch and 1 after: no buffer of its own in
 * the backward, no pass adding it (pass_memory's made_in_sum, codegen/emit_ops.c). Not a
 * tied parameter owner's, whose buffer receives the other rank's partial sum. A tied
 * partial (ir_value.tied_partial_of) is made in its own sum likewise. Free with free(). */
char *dm_micro_grads_in_sums(const ir_graph *g);
enum { DM_IN_GRAD_SUM = 1, DM_IN_PARTIAL_SUM = 2 }; /* dm_memory_plan.made_in_sum */

/* zero_gather.c: with g->zero == 3, each gradient bucket's parameters are read from a
 * range all-gathered before their first reader in the forward pass and again in the
 * backward (zero_gather and param_view ops; the next bucket's gather prefetched). Uses
 * pass_buckets's grouping (bucket_floats as there). requires: pipeline; renumbers values
 * (and the value ids in pipe and reshards). */
int pass_zero_gather(ir_graph *g, int64_t bucket_floats, dm_pipeline_plan *pipe, dm_reshard_list *reshards);
/* (n_params) 1 for each parameter a zero_gather reads (held in ZeRO 3's shares: its
 * gradient is reduce-scattered, and no all-gather follows its update); NULL when there are
 * none. Free with free(). */
char *dm_zero_gathered_params(const ir_graph *g);
/* After pass_zero_gather: the plan's predicted step again with ZeRO 3's gathers in each
 * stage's forward and backward (what prefetching hides of them, as far as the hardware
 * overlaps communication with computation, left out) and its shares' gradients
 * reduce-scattered rather than allreduced (pipeline.c). Nothing without gathers. */
void pipeline_retime_zero_gathers(const ir_graph *g, dm_pipeline_plan *plan, double bucket_bytes);
/* After a pass rebuilt the value list (map: old id -> new id): the value ids the plans made
 * so far hold, renamed (either plan may be NULL). */
void dm_plans_renumber(const int *map, dm_pipeline_plan *pipe, dm_reshard_list *reshards);

/* precision.c: with g->product_dtype bf16, every matrix product's f32 operands read through
 * casts (one per operand, stage and phase), the product accumulated and stored in f32.
 * requires: zero_gather (the final op order); renumbers values (and the ids in pipe and
 * reshards). */
int pass_precision(ir_graph *g, dm_pipeline_plan *pipe, dm_reshard_list *reshards);

/* pipeline.c, after memory: fills plan->readers (which stages read each buffer), from
 * which code generation sends each value to the stages that need it. */
void pipeline_plan_readers(dm_pipeline_plan *plan, const ir_graph *g, const dm_memory_plan *mem);

/* memory.c, after pipeline_plan_readers: with several pipeline stages, lays out
 * each stage's regions on their own (its parameters and copies of the tied ones it uses,
 * the gradients and optimizer state of those it updates, an arena by liveness over its
 * own ops and the values it receives), so that a rank allocates only its stage's share.
 * Leaves a one-stage plan as it is. */
void memory_plan_stages(dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe);
/* memory_stages.c, after pass_zero (whose layout of the sums it extends): a place in
 * its rank's gradient sums for each tied partial's sum (partial_sum_offset). */
void memory_plan_tied_sums(dm_memory_plan *plan, const ir_graph *g);
/* memory.c, for a target that updates a one-stage program's parameters in one call
 * (codegen_flat_update): the gradients in the order of the updates that read them (not
 * the backward pass's), and the optimizer state by slot, every update's first state tensor
 * (AdamW's exp_avg, SGD's momentum) one after another in the updates' order, then every
 * second one, so that each is laid out as the parameters are. Sizes and totals are
 * unchanged. Leaves the plan as it is with more than one rank, several stages, ZeRO or
 * parameter servers, or where a gradient or state buffer is not an update's own. */
void memory_update_layout(dm_memory_plan *plan, const ir_graph *g);
/* Where value id's buffer (its storage root's) is on `stage`'s ranks: its offset in their
 * region, or -1 when that stage holds no copy. stage < 0: its own stage. A parameter is held
 * once per rank: its stages (interleaved, several) share it. */
int64_t dm_offset_on(const dm_memory_plan *plan, const ir_graph *g, int id, int stage);
/* The same for the ranks of pipeline coordinate `rank`: a parameter's, on whichever of its
 * stages holds it. */
int64_t dm_offset_on_rank(const dm_memory_plan *plan, const ir_graph *g, int id, int rank);
/* What the ranks of pipeline coordinate `rank` hold: their stage's regions, or interleaved
 * the sums of their stages' (kept_elems then 0: held_elems is what they allocate). */
const dm_stage_memory *dm_rank_memory(const dm_memory_plan *plan, int rank);

/* Where gradient id sits in the micro-batches' gradient sum, and that sum's elements on
 * the ranks of pipeline coordinate `rank` (< 0: the largest). */
int64_t dm_grad_sum_offset(const dm_memory_plan *plan, int id);
int64_t dm_grad_sum_elems(const dm_memory_plan *plan, int stage);

/* The scratch a target's kernels need beyond the collectives' (codegen's dialects give
 * these), and the scratch of a whole step in elements: the largest need of any
 * collective (a gather's or reduce-scatter's whole tensor, both message sets of an
 * all-to-all) or kernel. */
typedef struct dm_scratch_rules {
    int64_t (*xent_floats)(int64_t rows, int64_t comm_size);
    int64_t (*embed_grad_bytes)(int64_t rows);
    int64_t (*wgrad_floats)(int64_t rows, int64_t n);
    /* NULL: no attention kernel; dtype: the attention's (product_dtype where attention_16bit) */
    int64_t (*attention_floats)(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype);
} dm_scratch_rules;
int64_t dm_scratch_elems(const ir_graph *g, const dm_scratch_rules *rules);

/* Whether output v is gathered whole only when the caller asks for it (a partitioned
 * program's f32 output that is split, a pending sum, or on one pipeline stage). */
int dm_output_gathered(const ir_graph *g, const ir_value *v);

/* What one rank allocates (host memory, the C target's layout: every buffer rounded to 64
 * bytes as dmrt_alloc rounds it), by part; `stage`: the pipeline coordinate of the rank
 * (0 without stages; interleaved, the rank holds several).
 * scratch_elems: dm_scratch_elems of the target. */
/* weight_versions.c: the schedules that do not flush (2bw, PipeDream-2BW; pipedream,
 * PipeDream's weight stashing) on a pipeline of 2 or more stages, of a program that trains
 * (dm_runs_2bw: either; dm_runs_pipedream: the second). The versions of its parameters
 * pipeline rank `stage` holds: 2 (2bw), P - stage (pipedream: one per micro-batch in
 * flight), else 1; and of the previous batch, the inputs (bit n: input n) that the
 * backwards rank `stage` owes at a step's end read, kept whole (every micro-batch). */
int dm_runs_2bw(const ir_graph *g);
int dm_runs_pipedream(const ir_graph *g);
int dm_weight_versions(const ir_graph *g, int stage);
uint64_t dm_2bw_kept_inputs(const ir_graph *g, const dm_memory_plan *plan, int stage);

typedef struct dm_memory_peak {
    int64_t params, grads, optimizer_state;
    int64_t activations;      /* the arena, times the micro-batches in flight */
    int64_t gradient_sums;    /* the micro-batches' gradients, summed */
    int64_t scratch;          /* collectives' and kernels' room */
    int64_t outputs;          /* the step's outputs by micro-batch */
    int64_t weight_version;   /* 2bw, pipedream: the parameters' versions but the first (params counts it) */
    int64_t previous_inputs;  /* 2bw, pipedream: the previous batch's inputs its owed backwards read */
    int64_t total;
    /* not in total: host memory a partitioned output takes when gathered whole, allocated
     * the first time the caller asks for it */
    int64_t gathered_outputs;
} dm_memory_peak;
void dm_memory_peak_of(const dm_memory_plan *plan, const ir_graph *g, const dm_pipeline_plan *pipe,
                       int64_t scratch_elems, int stage, dm_memory_peak *out);

/* buckets.c: which gradient allreduces are one call (a bucket) and which start during
 * the backward pass. bucket_floats: the largest bucket (0: DM_BUCKET_FLOATS). mem may be
 * NULL before memory planning (the grouping is the same). */
#define DM_BUCKET_FLOATS ((int64_t)25 * 1024 * 1024 / 4)
#define DM_FIRST_BUCKET_FLOATS ((int64_t)1024 * 1024 / 4)
typedef struct dm_bucket_plan {
    int *lead;    /* (n_values) for a gradient allreduced in a bucket: the bucket's first
                   * allreduce in the update phase (which reduces them all); else -1 */
    int *ready;   /* (n_values) for a lead whose bucket starts in the backward pass: the
                   * value after which every member's partial is complete; else -1 */
} dm_bucket_plan;

int pass_buckets(const ir_graph *g, const dm_memory_plan *mem, int64_t bucket_floats, dm_bucket_plan *plan);
/* Whether buckets may start during the backward pass of a plan of g with this many
 * pipeline stages and micro-batches: only with one of each (a gradient is complete only
 * after the last micro-batch), no ZeRO (its reduce-scatters run in the update) and no
 * gradient compression (its reductions are blocking). The cost model's overlap asks it too. */
int dm_buckets_start_in_backward(const ir_graph *g, int stages, int microbatches);
void dm_bucket_plan_free(dm_bucket_plan *plan);

/* zero.c: ZeRO 1, 2 and 3 over the gradient buckets (see there). */
typedef struct dm_zero_bucket {
    int lead;              /* the bucket's lead allreduce (dm_bucket_plan) */
    int axis;              /* the mesh axis its shares split over (k ranks) */
    int stage;             /* its pipeline stage */
    int first, last;       /* its parameters, [first, last] in declaration order */
    int64_t param_begin;   /* where the range starts in ctx->params */
    int64_t grad_begin;    /* and in the whole gradient layout (ctx->grads for zero 1) */
    int64_t span;          /* elements of the range, a multiple of k */
    int64_t share;         /* span / k: what each rank reduces and updates */
    int64_t state_at;      /* the share of optimizer state tensor j: ctx->state + state_at + j * state_stride */
    int64_t state_stride;  /* share, rounded to the memory plan's 16 elements */
    int64_t grad_at;       /* zero 2: the share of the gradient in ctx->grads; else -1 */
    int64_t param_at;      /* zero 3, parameters gathered (passes/zero_gather.c): the share of
                            * the parameters in ctx->params; else -1 (held whole, at param_begin) */
} dm_zero_bucket;

typedef struct dm_zero_plan {
    int stage;             /* g->zero */
    dm_zero_bucket *bucket;/* (n_buckets) */
    int n_buckets;
    int *bucket_of;        /* (n_params) the bucket updating parameter p, or -1 */
    int *update_of;        /* (n_params) parameter p's update op */
    int64_t *range_at;     /* (n_params) where parameter p starts in its bucket's range */
    int states;            /* optimizer state tensors per parameter */
    int64_t scratch_elems; /* what the buckets need of ctx->scratch */
} dm_zero_plan;

int pass_zero(const ir_graph *g, dm_memory_plan *mem, const dm_bucket_plan *buckets, dm_zero_plan *z);
void dm_zero_plan_free(dm_zero_plan *z);

/* compress.c: gradient compression of the buckets over the axis named data (--compress;
 * see there). */
typedef struct dm_compress_bucket {
    int lead;              /* the bucket's lead allreduce (dm_bucket_plan) */
    int axis, stage;       /* the data axis; its pipeline stage */
    int first, last;       /* its parameters, [first, last] in declaration order */
    int64_t grad_begin;    /* its range of ctx->grads: [grad_begin, grad_begin + elems) */
    int64_t elems;
    int64_t residual_at;   /* top-k, PowerSGD: the error-feedback residuals of the range, laid out as
                            * it, in ctx->state; else -1 */
    int64_t q_at, q_elems; /* PowerSGD: its matrices' Q factors in ctx->state, one after another */
    int64_t work_elems;    /* the scratch its reduction needs */
} dm_compress_bucket;

typedef struct dm_compress_plan {
    ir_compress_kind kind;
    dm_compress_bucket *bucket;  /* (n_buckets) */
    int n_buckets;
} dm_compress_plan;

/* "--compress TEXT" into *out: 0, or -1 with the reason in err. */
int dm_compress_parse(const char *text, ir_compress *out, char *err, size_t errlen);
/* "bf16", "topk:0.01", "powersgd:4", "none". */
void dm_compress_name(const ir_compress *c, char *buf, size_t size);
/* The mesh axis whose gradient allreduces are compressed: the one named data, when
 * compression is on and it has more than one rank; else -1. */
int dm_compress_axis(const ir_graph *g);
/* Whether v is a gradient's allreduce that compression replaces (none under ZeRO, whose
 * reduce-scatters replace them). */
int dm_compressed_allreduce(const ir_graph *g, const ir_value *v);
/* Under ZeRO with --compress bf16|fp16: ZeRO's reduce-scatters of gradients over `axis`
 * carry 16-bit values (dmrt_reduce_scatter_sum_half): 1 for bf16, 2 for fp16 (dmrt's
 * DMRT_BF16, DMRT_FP16); 0 when they carry f32. And whether gradient allreduce v is one
 * that such a reduce-scatter replaces. */
int dm_zero_reduces_half(const ir_graph *g, int axis);
int dm_zero_half_reduction(const ir_graph *g, const ir_value *v);
/* Top-k: the elements a rank sends of a gradient of n: round(ratio x n), at least 1. */
int64_t dm_topk_keep(const ir_compress *c, int64_t n);
/* PowerSGD: the local gradient as rows x cols (the last dim, and the product of the
 * others); whether it is compressed (rank 2 or more, and factors smaller than it). */
int dm_powersgd_matrix(const ir_graph *g, const ir_value *grad, int64_t *rows, int64_t *cols);
/* A compressed allreduce (dm_compressed_allreduce): the bytes one rank sends by ring
 * algorithms, its message steps in *messages; the flops of compressing and decompressing;
 * its elements of error-feedback state. */
double dm_compress_sent(const ir_graph *g, const ir_value *v, double *messages);
double dm_compress_flops(const ir_graph *g, const ir_value *v);
int64_t dm_compress_state_elems(const ir_graph *g, const ir_value *v);

int pass_compress(const ir_graph *g, dm_memory_plan *mem, const dm_bucket_plan *buckets, dm_compress_plan *plan);
/* The plan's bucket led by allreduce `lead`, or NULL. */
const dm_compress_bucket *dm_compress_bucket_of(const dm_compress_plan *plan, int lead);
void dm_compress_plan_free(dm_compress_plan *plan);

#endif
