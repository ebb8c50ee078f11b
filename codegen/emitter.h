/* emitter.h: the state code generation shares between its files (internal to codegen/):
 *   emit.c       the entry points, names, sections and files, what codegen refuses
 *   emit_util.c  the helpers: copies, collectives' callees, comments, strides, storage
 *   emit_ops.c   each op (and collective) as a dialect kernel description
 *   emit_step.c  the step's functions: phases, pipeline stages and schedules
 *   emit_step_api.c  the public forward, train_step and outputs that run them
 *   emit_api.c   the source's head and host functions in order, the small API functions
 *   emit_header.c  the public header
 *   emit_context.c  the context: storage, its helpers, create and destroy
 *   emit_params.c  initial parameters, shard <-> whole block moves of parameters
 *   emit_descriptor.c  the dmrt_model descriptor and its tensor tables
 *   emit_schedule.c  the learning rate: schedule, host override, API
 *   emit_clip.c  gradient clipping: the global norm over the mesh, the gradients scaled
 *   emit_predict.c  <model>_predict (inference: the forward without the loss)
 *   emit_state.c the optimizer state and step as checkpoints move them
 *   emit_compress.c  gradient compression of the data axis's buckets
 * Everything is spelled through the dialect (dialect.h); planning is the passes'. */
#ifndef DM_EMITTER_H
#define DM_EMITTER_H

#include <stdint.h>
#include <stdio.h>

#include "codegen.h"
#include "dialect.h"
#include "schedule.h"

/* A serial program's optimizer update as one call (emit_flat_update.c): its first and last
 * update ops, where the parameters, gradients and state start, the elements it covers
 * (padding between parameters included) and the parameters it updates. */
typedef struct cg_flat_update {
    int first, last, n_params, states;
    int64_t param_at, grad_at, state_at[2], count;
} cg_flat_update;

typedef struct emitter {
    const ir_graph *g;
    const dm_memory_plan *plan;
    const cg_dialect *dialect;
    const char *source_path;   /* as quoted in comments: the file name */
    const char *source_text;
    size_t source_len;
    size_t *line_start;        /* (n_lines) offset of each line of the source */
    int n_lines;
    char **cname;              /* (n_values) C identifier of the value's buffer */
    ir_type *local;            /* (n_values) the value as one rank holds it: split dims divided */
    int partitioned;           /* the mesh splits something: SPMD code with communicators */
    int tf32;                  /* --tf32 */
    int64_t scratch_elems;     /* floats of ctx->scratch: collectives rearrange blocks there, and
                                * kernels that need room (cross-entropy) use it */
    const int *bucket_lead;    /* (n_values) the bucket plan's (passes/buckets.c) */
    const int *bucket_ready;   /* (n_values) */
    const dm_zero_plan *zero;  /* ZeRO's buckets (passes/zero.c); n_buckets 0 without */
    const dm_compress_plan *compress; /* the compressed gradient buckets (passes/compress.c); n_buckets 0 without */
    /* micro-batches and pipeline stages (g->microbatches > 1 or a pipeline axis): each
     * stage's forward and backward of one micro-batch are functions, run in the order of
     * the schedule by a generated step function per stage */
    int scheduled;
    int stages;                /* the pipeline's stages: P, or P * chunks interleaved (1 without
                                * a pipeline axis) */
    int ranks;                 /* P: the pipeline axis's size (1 without one) */
    int chunks;                /* model chunks (stages) per pipeline rank: 1 but interleaved */
    int pipe_axis;             /* the pipeline's mesh axis, or -1 */
    const pipe_schedule *sched;/* every stage's actions, as the generated step runs them (the
                                * pipeline plan's) */
    const dm_pipeline_plan *predicted; /* the step's predicted times (dmrt_model), NULL: none */
    int *slots;                /* (stages) micro-batches whose temporaries a stage holds at once
                                * (the pipeline plan's in-flight counts): a copy of the arena each */
    const uint64_t *needed_on; /* (n_values) for a buffer's owner: the stages reading it (bit per stage) */
    int *fault_site;           /* (n_values) the number of an op's range check (from 1), or 0 */
    int n_faults;
    int phase_faults;          /* the function being emitted has a range check */
    const char *on_fail;       /* the statement a failed device call runs in the current function */
    int cur_stage;             /* the pipeline stage whose function is being emitted (its buffers'
                                * offsets are that stage's), or -1 */
    const char *arena_var;     /* how code reaches the arena: ctx->arena, or a micro-batch's copy */
    const char *kept_var;      /* how it reaches the micro-batch's kept values (from
                                * stage_kept_from(cur_stage) on), NULL: as the rest */
    int dropout;               /* the program has dropout ops: the context keeps the seed and a
                                * training flag (codegen/emit_dropout.c) */
    int in_micro;              /* the function being emitted has a micro-batch index `micro` */
    int creating;              /* the function being emitted makes the values made at create
                                * (passes/hoist_constants.c), which the step's functions skip */
    int update_part;           /* an update function split by clipping or loss scaling (emit_clip.c): 1 while its
                                * gradient reductions are emitted, 2 its updates; 0: unsplit */
    int update_half;           /* interleaved fp16 or clipping: a stage's update as two functions, the
                                * rank's update deciding for its chunks between them (emit_clip.c,
                                * emit_chunk_squares): 1 while the first is emitted (stage%d_reduce:
                                * the reductions and the squares of the stage's gradients), 2 the
                                * second (stage%d_update: the unscaling or clipping, and the updates);
                                * 0: one function */
    int *summed;               /* (n_values) dm_summed_partials: outside the micro-batches'
                                * functions, such a gradient is read from ctx->grad_sum */
    const int *activation_of_bias; /* (n_values) a bias's add run with its product: the activation
                                * (gelu, relu, ...) that adds the bias in its own pass, or -1
                                * (passes/fuse_bias.c) */
    int *no_bias_activations;  /* activation_of_bias when there is no such plan: all -1 */
    unsigned char *copy_alone; /* (n_values) cg_mark_copy_alone: the kernel stores its folded
                                * cast's copy alone */
    cg_flat_update flat_update; /* cg_plan_flat_update: the one update call over every
                                * parameter (emit_flat_update.c); first -1 where there is none */
    int *reader_at, *reader_ids; /* cg_index_readers: the ops with value x among their
                                * operands are reader_ids[reader_at[x] .. reader_at[x + 1]),
                                * in program order (an op once per operand that is x) */
    int *reads;                /* (n_values) cg_index_readers: the operands that are x and that
                                * their op reads (ir_reads_operand: an elementwise gradient reads
                                * its forward's result only where its rule names y) */
    int n_states;              /* state tensors a checkpoint holds: the optimizer's, then compression's (emit_state.c) */
    unsigned char *for_outputs;/* (n_values) the values the outputs need: predict runs only these
                                * of the forward (emit_predict.c) */
    int quant_bits;            /* --quantize: 8 or 4 (weights stored narrow, emit_quant.c), 0 without */
    int64_t quant_group;       /* int4's rows per scale */
    int quant_act;             /* --quantize int8: int8 activations, int8 x int8 products */
    int *quant_slot;           /* (n_values) a quantized weight's index in ctx->quant, or -1 */
    int *quant_param;          /* (n_quant) the parameter index of each */
    char *quant_transposed;    /* (n_quant) 1: read x @ transpose(W), stored as its transpose */
    char *quant_narrow;        /* (n_quant) 1: held narrow only (dm_weight_held_narrow, asked once) */
    int n_quant;
    int n_narrow_only;         /* of them, held narrow only: no f32 copy (dm_weight_held_narrow) */
    int64_t quant_work_bytes;  /* the dialect's work memory for the products (quant_work_bytes) */
    char prefix_upper[128];
    cg_writer w;               /* host functions */
    cg_writer kernels;         /* file-scope kernels (the dialect's) */
    struct cg_outline *outline; /* the ops' loops written once a file (outline_loops.c), NULL until used */
} emitter;

static inline const ir_value *V(const emitter *E, int id) { return E->g->values[id]; }

/* The type of value id as one rank holds it (the global type when unpartitioned). */
static inline const ir_type *T(const emitter *E, int id) { return &E->local[id]; }

/* A reshape planned to share its operand's buffer: no code, no buffer of its own. */
static inline int shares_buffer(const emitter *E, int id) { return E->plan->storage_of[id] != id; }

/* An add that runs its product: a bias's, sharing the product's buffer (pass_memory's
 * bias_add_of), or a sum's, the product accumulated into the sum's buffer (sum_add_of). */
static inline int runs_product(const emitter *E, const ir_value *v) { return dm_product_run_by(E->plan, v) >= 0; }

/* A value of a window assembly that writes into the sum's buffer: a piece made in its
 * window, or a pad copying its piece there (passes/memory_windows.c). */
static inline int writes_window(const emitter *E, const ir_value *v) {
    return E->plan->assembled_in[v->id] >= 0 && v->op != OP_ADD && !(v->op == OP_PAD && dm_piece_in_place(E->plan, v));
}

/* Whether value id is made in its micro-batches' sum (pass_memory's made_in_sum), or in a
 * window of one (an assembly's piece). */
static inline int made_in_sum(const emitter *E, int id) {
    return E->plan->made_in_sum && E->plan->made_in_sum[E->plan->storage_of[id]];
}
/* Whether add v is a micro-batch gradient made in its sum by its two operands (passes/
 * memory.c's add_of_two_in_place): it emits nothing. */
static inline int add_made_by_operands(const emitter *E, const ir_value *v) {
    return v->op == OP_ADD && E->plan->made_in_sum && E->plan->made_in_sum[v->id] && E->plan->assembled_in[v->id] < 0;
}
/* A value that shares another's buffer and emits no code (a reshape, a view, a window
 * assembly's add; not a cross-entropy gradient written over its logits, nor an operand of
 * an add made in its sum by them). */
static inline int emits_nothing(const emitter *E, const ir_value *v) {
    return shares_buffer(E, v->id) && !runs_product(E, v) && !writes_window(E, v) &&
           !dm_xent_grad_over_logits(E->plan, v) && !add_made_by_operands(E, V(E, E->plan->storage_of[v->id]));
}

/* (a value made in its micro-batches' sum has no buffer of its own, but is declared there) */
static inline int has_storage(const emitter *E, int id) { return E->plan->region[id] != REGION_NONE || made_in_sum(E, id); }

static inline const char *ctype(ir_dtype t) { return t == DT_I32 ? "int32_t" : ir_dtype_is_half(t) ? "uint16_t" : "float"; }

static inline int64_t axis_size(const emitter *E, int axis) { return E->g->axes[axis].size; }

/* The pipeline coordinate of the ranks running stage st. */
static inline int rank_of(const emitter *E, int st) { return E->ranks > 1 ? st % E->ranks : 0; }

/* Product of dims [from, to) of t. */
static inline int64_t dims_product(const ir_type *t, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= t->shape[d];
    return n;
}

/* A stage holding several micro-batches keeps a copy per micro-batch of the arena from
 * kept_from on (its kept values: passes/memory.c), kept_stride elements apart. Without
 * stages' layouts, the whole arena is copied. */
static inline int64_t stage_kept_from(const emitter *E, int stage) {
    const dm_memory_plan *P = E->plan;
    if (!(P->stages > 1 && stage >= 0)) return 0;
    return P->stage[stage].arena_base + P->stage[stage].arena_elems - P->stage[stage].kept_elems;
}
static inline int64_t stage_kept_stride(const emitter *E, int stage) {
    return E->plan->stages > 1 && stage >= 0 ? E->plan->stage[stage].kept_elems : E->plan->arena_elems;
}

/* Whether the bucket led by lead is started in the backward pass. */
static inline int bucket_started_early(const emitter *E, int lead) { return E->bucket_ready[lead] >= 0; }
/* The ZeRO bucket updating parameter p (passes/zero.c), or NULL. */
static inline const dm_zero_bucket *zero_bucket_of(const emitter *E, int p) {
    return E->zero->n_buckets && p >= 0 && E->zero->bucket_of[p] >= 0 ? &E->zero->bucket[E->zero->bucket_of[p]] : NULL;
}

/* emit_fused_cast.c: the cast that v's kernel stores as it writes v; -1 when there is
 * none or it cannot be folded in. */
int fused_cast_of(const emitter *E, const ir_value *v);
/* Whether the buffers of values a and b are seen not to overlap: in different regions, or
 * apart in the arena (one layout: no pipeline stages or micro-batches). */
int cg_buffers_apart(const emitter *E, int a, int b);
/* emit_residual_norm.c: the layernorm that makes residual add v in its own row pass
 * (can.residual_norm), or -1; and the add a layernorm so makes, or -1. */
int residual_norm_of(const emitter *E, const ir_value *v);
int residual_made_by_norm(const emitter *E, const ir_value *ln);
/* emit_bias_grad.c (can.gemm_bias_grad): the weight gradient's product that sums sum_to v,
 * a bias's gradient, in its own call, made at v's place; or -1. And the sum_to that
 * product w so sums, or -1. */
int product_summing_bias(const emitter *E, const ir_value *v);
int bias_summed_by_product(const emitter *E, const ir_value *w);
/* Whether value may be made at op place, earlier than its own (one layout: no pipeline
 * stages or micro-batches), landing where nothing in use between the two places lies:
 * - in a gradient's buffer (its own, or its window of a gradient read in windows:
 *   memory_windows.c) that no value between the two writes; nothing reads it before;
 * - in the arena (a data-parallel rank's partial gradient, allreduced later): apart from
 *   every buffer in use from place on (those made from there to value, and those made
 *   earlier and read there or later), but the values sharing its buffer (other windows
 *   of its assembly) made before place. */
int cg_may_make_early(const emitter *E, int place, int value);
/* Whether cast is stored by the kernel of the op that makes its operand (fused_cast_of):
 * it writes no code of its own and reads nothing. */
int cast_made_by_producer(const emitter *E, const ir_value *cast);
/* Whether nothing but v's folded cast c (fused_cast_of) reads v's f32 value: v and the
 * reshapes between it and c are step temporaries, each read by the next alone (E->reads). */
int cg_cast_only_reader(const emitter *E, const ir_value *v, int c);
/* Indexes once, into E->reader_at and E->reader_ids, the ops that have each value as an
 * operand, and counts into E->reads the operands read: the searches for an op's partner (a
 * bias gradient's product, a layernorm weight gradient's sum) look at its operand's
 * readers instead of every op of the program. */
void cg_index_readers(emitter *E);
/* The first op after `after` (in program order) with value x at operand `slot` and op
 * `op`, or -1. */
int cg_next_reader(const emitter *E, int x, int after, ir_op op, int slot);
/* The last op before `before` with value x at operand `slot` and op `op`, or -1. */
int cg_last_reader(const emitter *E, int x, int before, ir_op op, int slot);
/* Decides once, into E->copy_alone, which kernels store their folded cast's copy alone
 * (can.copy_alone): an elementwise op, a transpose, a slice or a layernorm whose value
 * only the cast reads (cg_cast_only_reader); emit_ops.c. */
void cg_mark_copy_alone(emitter *E);
/* Whether v's kernel stores its folded cast's copy alone, not v's f32 value, which it
 * then does not name. */
static inline int cg_stores_copy_alone(const emitter *E, const ir_value *v) { return E->copy_alone[v->id]; }
/* The sum_to right after cast, of the same f32 tensor, whose loop stores the cast's copy as
 * it reads each element (can.cast_with_sum); or -1. And the cast a sum_to so stores, or -1. */
int cast_summed_with(const emitter *E, const ir_value *cast);
int cast_stored_by_sum(const emitter *E, const ir_value *sum);
/* emit_ops.c: whether sum_to v is made by another op's kernel (a layernorm weight
 * gradient's pass, a weight gradient's product), not by a loop of its own. */
int sum_made_elsewhere(const emitter *E, const ir_value *v);

/* emit_compress.c: the context's field, the segment tables and PowerSGD's start (in the
 * source's head), its call in create, and a compressed bucket's reduction (its partials
 * already copied into ctx->grads; label: "allreduce of the gradients ..."). */
void emit_compress_fields(emitter *E);
void emit_compress_tables(emitter *E);
void emit_compress_create(emitter *E);
void emit_compressed_reduce(emitter *E, const dm_compress_bucket *b, const char *label);
/* Top-k's and PowerSGD's state in checkpoints, after the optimizer's n_optimizer tensors:
 * how many tensors; their descriptors (rows of state_descs); their dmrt_state_layout (rows
 * of state_layouts); the tables and gather_compress_state / scatter_compress_state. */
int cg_compress_state_count(const emitter *E);
void emit_compress_state_descs(emitter *E);
void emit_compress_state_layouts(emitter *E);
void emit_compress_state_moves(emitter *E, int n_optimizer);
/* Whether fp16's loss scaling meets top-k or PowerSGD: the compressed buckets are then
 * checked and unscaled before their reduction (their error feedback never holds a skipped
 * step's gradients nor loss-scaled ones), which the scaler (emit_clip.c) joins. */
int cg_compress_checks_scaled(const emitter *E);
/* The interleaved schedule's form of that check, in pipeline rank `rank`'s update before any
 * of its chunks reduces: every chunk's compressed partials, `float compress_not_finite`
 * agreed over the mesh, which each chunk's stage%d_reduce then takes. */
void emit_rank_compress_check(emitter *E, int rank);

/* emit_ps.c: parameter servers (--param-servers): whether the program has them (a data
 * mesh that trains with an optimizer); the tables, the update the servers run and the
 * layout (in the source's head); the context's field; a worker's push and pull at the end
 * of its update phase; destroy's goodbye to the servers; <model>_serve's declaration and
 * definition; the descriptor's fields. */
int emits_param_servers(const emitter *E);
int emits_async_param_servers(const emitter *E);  /* with --ps-staleness */
void emit_ps_tables(emitter *E);
void emit_ps_fields(emitter *E);
void emit_ps_exchange(emitter *E);
void emit_ps_skipped_exchange(emitter *E);        /* fp16's skipped step, asynchronous servers */
void emit_ps_finish(emitter *E);
void emit_ps_declaration(emitter *E);
void emit_ps_api(emitter *E);
void emit_ps_descriptor(emitter *E);
void emit_ps_checkpoint_descriptor(emitter *E);  /* the descriptor's last fields */
void emit_ps_checkpoint_hooks(emitter *E);       /* the descriptor's ps_snapshot, ps_updates, set_ps_updates */
/* Checkpoints: gather_state and scatter_state of the n optimizer states ids, through the
 * servers' snapshot (the workers hold no optimizer state). */
void emit_ps_state_moves(emitter *E, const int *ids, int n);
int cg_ps_states(const emitter *E);                      /* optimizer state floats per parameter float */
int64_t cg_ps_state_at(const emitter *E, int p, int k);  /* state k of parameter p in the servers' layout */

/* emit_2bw.c: the schedules that do not flush, 2bw (PipeDream-2BW) and pipedream (weight
 * stashing): whether the program runs one (a pipeline that trains with an optimizer); the
 * context's fields; the elements of buffer
 * previous_<input n> (an expression of the rank's stage into buf; 0: the buffer is not
 * made); create's set-up after the allocations; the helpers before the stages' functions;
 * stage st's owed backward, next version, step and drain (after its forward, backward
 * and update); <model>_drain's declaration and definition. */
int emits_2bw(const emitter *E);
void emit_2bw_fields(emitter *E);
int emit_2bw_kept_count(const emitter *E, int n, char *buf, size_t size);
void emit_2bw_create(emitter *E);
void emit_2bw_helpers(emitter *E);
void emit_2bw_stage(emitter *E, int st);
void emit_2bw_declaration(emitter *E);
void emit_2bw_api(emitter *E);

/* emit_dropout.c */
int emit_dropout_prepare(emitter *E, FILE *err);
void emit_dropout(emitter *E, const ir_value *v);

/* emit_util.c: the helpers (emit.c is the entry point: codegen_write, codegen_check) */
void cg_copy_elems(emitter *E, const char *dst, const char *src, long long n, const char *type, cg_copy_kind kind);
void cg_zero_elems(emitter *E, const char *ptr, long long n, const char *type);
const char *cg_comm_callee(const emitter *E, const char *op, char *buf, size_t size);
void cg_shape_comment(const emitter *E, const ir_type *t, char *buf, size_t size);
void cg_source_line(const emitter *E, int line, char *buf, size_t size);
void cg_contiguous_strides(const ir_type *t, int64_t *stride);
void cg_coalesce(cg_loop_nest *k);
void cg_storage_expr(const emitter *E, int id, char *buf, size_t size);
/* For value id made in its micro-batches' sum: the run-time condition under which it adds
 * to the sum rather than overwrites it ("micro > 0"), or NULL when it always adds (the
 * later of an add's two operands made there: the earlier one wrote it first). */
const char *cg_sum_adds_if(const emitter *E, int id);
/* Where in ctx->grad_sum value id is made (dm_memory_plan.made_in_sum): its gradient's
 * sum, or its tied partial's; an assembly's piece, its window there. */
void cg_sum_made_in(const emitter *E, int id, char *buf, size_t size);
/* Where this rank's block of input id starts in the caller's whole batch, in elements. */
void cg_input_block_offset(const emitter *E, int id, char *buf, size_t size);
/* The position in the step's batch of element 0 of the ids (targets) `id` a kernel
 * range-checks, as a C expression: what its fault position is reported after. */
void cg_fault_position_base(const emitter *E, int id, char *buf, size_t size);

/* emit_ops.c */
void emit_bucket_start(emitter *E, const int *start_after, int id);
void emit_bucket_waits(emitter *E);
/* emit_zero.c: a ZeRO bucket's reduce-scatter, its share's update, the parameters' all-gather;
 * ZeRO 3's gathers of a bucket's parameters (started) and its views (the first waits). */
void emit_zero_bucket(emitter *E, const dm_zero_bucket *b);
/* ... with update_part 1 the bucket's reduce-scatter only, and its updates and all-gather
 * later, from emit_zero_bucket_updates. The blocks of a member's elements in the rank's
 * share ([lo, hi) with share_begin declared), and where the share of the gradients is. */
void emit_zero_bucket_updates(emitter *E, const dm_zero_bucket *b);
/* emit_flat_update.c: update op v of a serial program whose update is one call over its
 * parameters laid end to end (the dialect's can.flat_update): the call at the first
 * update, a comment at the others; 0 where v takes its own call. */
int emit_flat_update(emitter *E, const ir_value *v);
/* Whether update op v is in such a call (its operands then need no local names). */
int flat_update_covers(const emitter *E, const ir_value *v);
/* Plans that call once, into E->flat_update. */
void cg_plan_flat_update(emitter *E);
void zero_open_member(emitter *E, const dm_zero_bucket *b, int p);
void zero_close_member(emitter *E);
void zero_grad_share(const emitter *E, const dm_zero_bucket *b, char *buf, size_t size);
void emit_zero_gather(emitter *E, const ir_value *v);
/* In a scatter function (whole, p, start, block in scope): the rank's block of whole, and of it
 * the elements in the rank's share of the range, into storage; row: a {axis, share, this rank's
 * share in storage, the parameter's place in the range, ...} table row. Returns from it. */
void emit_share_scatter(emitter *E, const char *row, const char *storage);
void emit_param_view(emitter *E, const ir_value *v);
void emit_op(emitter *E, const ir_value *v);

/* emit_step.c */
void emit_phase(emitter *E, ir_phase phase, int stage, const char *fn, const char *what);
/* The functions making the values made at create (passes/hoist_constants.c), and their
 * calls in create (after the parameters' initialisation; a failure goes to `fail`). */
void emit_constants(emitter *E);
void emit_constants_call(emitter *E);
void emit_stages(emitter *E);
/* emit_step_end.c: a serial step's one wait at its end where the dialect has step_end */
int emits_step_end(const emitter *E);
void emit_upload(emitter *E);
void emit_upload_reserve(emitter *E);
/* Elements of input v that emit_upload copies: its whole type, times the micro-batches. */
int64_t emit_upload_elems(const emitter *E, const ir_value *v);
void emit_finish_step(emitter *E);
void emit_open_serial_forward(emitter *E);
void emit_serial_api_step_end(emitter *E, int (*open_train_step)(emitter *));
/* emit_step_api.c: <model>_forward, _train_step and the outputs' accessors */
void emit_output_accessor(emitter *E, const ir_value *v, const char *where, long long n);
void emit_scheduled_api(emitter *E);
void emit_serial_api(emitter *E);
/* After a step's micro-batches, the gradients of stage st's parameters: the mean of their
 * sums. *any: whether the heading comment is out already. */
void emit_gradient_means(emitter *E, int st, int *any);
/* pipedream: stage st's micro-batch gradient (in ctx->grad_sum, of that micro-batch alone)
 * where the update reads it. */
void emit_micro_gradients(emitter *E, int st);
/* emit_step.c: whether stage st holds a copy of a parameter another stage updates (tied),
 * of one the stage `owner` updates (owner < 0: any); pipedream: the receives of one update of those owner
 * updates (owner < 0: of every owner), into ctx->params. */
int holds_tied_copies(const emitter *E, int st);
int holds_tied_copies_of(const emitter *E, int st, int owner);
void emit_tied_receives(emitter *E, int st, int owner);

/* emit_schedule.c: the learning rate (ctx->lr) of each update: the API's declarations, the
 * context's fields, the schedule and next_learning_rate (train_step calls it first), the API
 * and the descriptor's fields. emits_update: the model has an optimizer update. */
int emits_update(const emitter *E);
void emit_schedule_declarations(emitter *E);
void emit_schedule_fields(emitter *E);
void emit_schedule(emitter *E);
void emit_schedule_api(emitter *E);
void emit_schedule_descriptor(emitter *E);

/* emit_clip.c: clipping's norm and scaling of the gradients of stage's updates (stage < 0:
 * all), between their reductions and the updates. */
void emit_clip(emitter *E, int stage);
/* At create: the device room clipping without a wait needs (nothing where it reads the norm). */
void emit_clip_reserve(emitter *E);
/* emit_prune.c: --prune's refusals (0, or -1 after a message), its schedule table, its check
 * of the run's total steps (in next_learning_rate), and its call after a weight's update. */
int check_prune(const emitter *E, FILE *err);
void emit_prune_schedule(emitter *E);
void emit_prune_needs_total(emitter *E);
void emit_prune(emitter *E, int mask_id);
/* emit_prune_heads.c: a mask of an attention's heads (ir_value.prune_group); whether an
 * attention's weights are in more than one pipeline stage (refused) */
void emit_prune_heads(emitter *E, int mask_id);
int prunes_heads(const emitter *E);            /* some weight's :rows unit is an attention's head */
int prune_heads_span_stages(const emitter *E);
/* fp16's loss scaling in an update function, before clipping and the updates: the check of
 * every gradient over the mesh (a skipped step returns from the function), the unscaling,
 * the scale's growth. */
void emit_loss_unscale(emitter *E, int stage);
/* A float x of every rank summed over each mesh axis of more than one rank (labels "WHAT
 * over AXIS"); a failed sum returns comm_failed(ctx) from the generated function. */
void cg_sum_over_mesh(emitter *E, const char *x, const char *what);
/* The same with the interleaved schedule's chunks, one decision a step for all of a rank's
 * (emit_step.c splits each chunk's update function around it): a chunk's squares (at the
 * end of its stage%d_reduce, added to `double *rank_squares`), the rank's decision (in
 * rank%d_update, on its `double rank_squares`: fp16's skip, which returns, or clipping's
 * factor `clip_scale` over the mesh), a chunk's unscaling or clipping (at the start of its
 * stage%d_update, clipping's given `float clip_scale`), the rank's count of a clean step
 * (fp16, after its chunks'). */
void emit_chunk_squares(emitter *E, int stage);
void emit_rank_loss_skip(emitter *E);
void emit_rank_clip(emitter *E);
void emit_chunk_unscale(emitter *E, int stage);
void emit_chunk_clip(emitter *E, int stage);
void emit_rank_loss_clean(emitter *E);
/* emit_params.c: in a generated gather or scatter function, the rank's block of the whole
 * tensor into its shard (C expression), or the shard (`shard`) into the whole tensor,
 * through host memory where the dialect's is separate (but where the generated int
 * `on_host`, when named, is set: shard is in host memory already). */
void cg_block_into_shard(emitter *E, const char *shard);
void cg_shard_into_block(emitter *E, const char *on_host);
/* In a gather function: a ZeRO range all-gathered from the ranks' shares into host memory
 * (`range`, declared NULL; freed by the caller), `shard` then pointing at element `at` of it
 * and, where the dialect's memory is separate, `on_host` set. row: its table row (z: axis, share, ...); send: C expression of this
 * rank's share in the context's storage (through host memory where that is separate);
 * elems: the range's length; name: the collective's label. */
void emit_range_gather(emitter *E, const char *row, const char *send, const char *elems, const char *at, const char *name);
/* C expression (int64_t): the optimizer's updates so far, the one in progress counted:
 * ctx->step, less the steps loss scaling skipped. */
const char *cg_updates_done(const emitter *E);
/* The optimizer that updates parameter p: the program's, or with weight_decay_1d = false
 * and p of one dim in weight files (a bias, a norm's weight) a copy without weight decay,
 * in *scratch. */
const ir_optimizer *cg_param_optimizer(const emitter *E, int p, ir_optimizer *scratch);
/* emit_predict.c: <model>_predict, and the guard that makes the forward skip the loss */
void predict_mark(emitter *E);
int predict_runs(const emitter *E, int id);
void predict_guard(emitter *E, int id, int *open);
void emit_predict_decl(emitter *E);
void emit_predict_api(emitter *E);
void emit_predict_wrapper(emitter *E);
void emit_predict_fields(emitter *E);
/* Whether product v reads a --quantize'd weight (emit_quant_product runs it). */
int is_quant_product(const emitter *E, const ir_value *v);
/* Whether embedding v gathers its rows from a table held narrow only (--quantize-embeddings
 * on the C target): the slot of its dmrt_qweight, or -1. */
int quant_gather_slot(const emitter *E, const ir_value *v);

/* emit_quant.c: --quantize's narrow weights: which (quant_mark), the context's fields, their
 * making in create and freeing in destroy, where the storage is separate the helpers that
 * copy them there (emit_quant_support, before create), the descriptor's accessors and
 * fields, and a forward product reading one (1: emitted by the dialect's quant_gemm in
 * place of its gemm) */
void quant_mark(emitter *E);
void emit_quant_fields(emitter *E);
/* In create: the narrow weights' storage (before init_params, which quantizes those held
 * narrow only), then the values of the others, quantized from their f32 parameters. */
void emit_quant_alloc(emitter *E);
void emit_quant_create(emitter *E);
/* Narrow weight j of parameter p, when it has no f32 copy: its slot, else -1. */
int quant_narrow_slot(const emitter *E, int p);
/* A serial program with weights held narrow only: gather_param and scatter_param (the
 * descriptor's gather and scatter), which dequantize and quantize those and copy the rest. */
void emit_narrow_param_copies(emitter *E);
/* The generated quantize_narrow(ctx, j, p, whole) (a weight held narrow only quantized
 * from f32 values, and uploaded where the products read another copy); and the switch
 * that opens gather_param (gather 1: such a weight dequantized into whole) or
 * scatter_param (0: quantized from it). Nothing where no weight is held narrow only. */
void emit_quantize_narrow(emitter *E);
void emit_narrow_param_cases(emitter *E, int gather);
void emit_quant_support(emitter *E);
void emit_quant_destroy(emitter *E);
void emit_quant_accessor(emitter *E);
void emit_quant_descriptor(emitter *E);
int emit_quant_product(emitter *E, const ir_value *v, const cg_gemm *k);
/* --quantize int8: the line a forward entry point starts with, refusing uncalibrated scales */
void emit_quant_ready_check(emitter *E);

/* emit_state.c: checkpoints' optimizer state and step: the API's declarations, the tables,
 * moves and API (after the step's functions), the descriptor's fields */
void emit_state_declarations(emitter *E);
void emit_state_support(emitter *E);
void emit_state_descriptor(emitter *E);

/* emit_header.c: <model>.h */
void emit_header(emitter *E);
/* emit_params.c: initial parameters; on a mesh, the tables and block moves between a rank's
 * shard and the whole tensor; serial in a separate memory (the dialect's separate_memory),
 * the copies to and from host memory */
void emit_init(emitter *E);
void emit_spmd_support(emitter *E);
void emit_host_param_copies(emitter *E);
/* emit_context.c: the context struct, its helpers, create and destroy */
void emit_context_struct(emitter *E);
void emit_context_helpers(emitter *E);
void emit_create_destroy(emitter *E);
/* emit_descriptor.c: a tensor's row of a table, the tables, the dmrt_model descriptor */
void emit_tensor_desc(emitter *E, const ir_value *v, const char *name);
void emit_descs(emitter *E);
void emit_descriptor(emitter *E);
/* emit_api.c: the source's head and its host functions */
void emit_source_head(emitter *E);
void emit_source_body(emitter *E);

/* outline_loops.c: where the dialect can (can.outline_loops), an op's loops become a static
 * function written once a file and called by every op whose loops are the same. Between a
 * phase function's begin and end (its buffers: used, as declare_buffers declares them), each
 * op's text from outline_op_begin to outline_op_end is captured and written as a call or,
 * when it is not self-contained, as it was. */
void outline_phase_begin(emitter *E, const char *used);
void outline_phase_end(emitter *E);
void outline_op_begin(emitter *E);
void outline_op_end(emitter *E, const ir_value *v);
void outline_free(emitter *E);
/* The C type declare_buffers gives value i's pointer ("float *", "const int32_t *"). */
void cg_buffer_type(const emitter *E, int i, char *buf, size_t size);

#endif
