/* emit_fused_cast.c: a 16-bit cast folded into the kernel that makes its operand
 * (can.fused_cast). passes/precision.c places an activation's cast right after the op
 * that makes it; here that op's loop nest (or layernorm row) also stores the rounded copy,
 * so the f32 value is not read a second time and the cast's own loop is not written.
 *
 * The cast is written at the producer, before its own position: the memory plan keeps
 * the producer's operands alive to the cast (passes/memory.c), so that none of their
 * buffers is the cast's; the fold is still made only where the cast's buffer is seen to be
 * apart from every operand's and the producer's. Where a target's loop nest cannot store
 * the copy in the same kernel (CUDA's sums and serial nests), it writes the cast as a
 * kernel of its own right after the nest. Not folded: pipelines and micro-batches (their
 * stages and micro-batches lay the arena out apart). */
#include "emitter.h"

/* [start, end) of value id's buffer (its storage root's, whole) in floats of its region
 * (one layout: fused_cast_of folds no cast where stages have layouts of their own). */
static void buffer_range(const emitter *E, int id, int64_t *start, int64_t *end) {
    int root = E->plan->storage_of[id];
    int64_t bytes = ir_numel(T(E, root)) * ir_dtype_bytes(T(E, root)->dtype);
    *start = E->plan->offset[root];
    *end = *start + (bytes + 3) / 4;
}

int cg_buffers_apart(const emitter *E, int a, int b) {
    if (E->plan->region[a] != E->plan->region[b]) return 1;
    if (E->plan->region[a] != REGION_ARENA) return 0; /* inputs, parameters: not a cast's */
    int64_t a0, a1, b0, b1;
    buffer_range(E, a, &a0, &a1);
    buffer_range(E, b, &b0, &b1);
    return a1 <= b0 || b1 <= a0;
}

/* The layernorm gradient add v runs into its sum (pass_memory's sum_add_of), or NULL. */
static const ir_value *runs_norm_grad(const emitter *E, const ir_value *v) {
    int m = dm_product_run_by(E->plan, v);
    return m >= 0 && V(E, m)->op == OP_LAYERNORM_GRAD ? V(E, m) : NULL;
}

/* Whether v's kernel writes its whole value densely in one pass that can store a copy:
 * an elementwise op's loop nest (with a bias's add or not), a transpose, a slice (not a
 * pad: it writes its window only), layernorm or its input gradient. */
static int makes_in_one_pass(const emitter *E, const ir_value *v) {
    if (v->type.dtype != DT_F32 || v->op == OP_DROPOUT || E->plan->assembled_in[v->id] >= 0 ||
        E->plan->row_stride[v->id] != 0)
        return 0;
    /* a residual's gradient that a layernorm gradient adds itself into: its row pass */
    if (runs_norm_grad(E, v)) return E->dialect->can.fused_cast_layernorm;
    if (shares_buffer(E, v->id)) return 0;
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_BINARY: return !runs_product(E, v);
    case OPC_TRANSPOSE: return 1;
    case OPC_SLICE: return v->op == OP_SLICE; /* a weight's window, such as c_attn's q, k or v */
    case OPC_NORM: return (v->op == OP_LAYERNORM || v->op == OP_LAYERNORM_GRAD) && E->dialect->can.fused_cast_layernorm;
    default: return 0;
    }
}

int fused_cast_of(const emitter *E, const ir_value *v) {
    const ir_graph *g = E->g;
    /* g->casts_with_producer: the memory plan kept the producer's operands alive to the
     * cast. One layout for the whole step (no pipeline stages, no micro-batches' copies of
     * the arena), so the decision is the same wherever it is asked. */
    if (!g->casts_with_producer || !E->dialect->can.fused_cast || E->plan->stages > 1 || g->microbatches > 1 ||
        !makes_in_one_pass(E, v) || dm_made_at_create(E->plan, v->id))
        return -1;
    /* the cast, after reshapes sharing v's buffer (they write nothing) */
    int last = v->id, c = v->id + 1;
    while (c < g->n_values && V(E, c)->op != OP_PARAM_VIEW && ir_op_info_of(V(E, c)->op)->cls == OPC_RESHAPE &&
           V(E, c)->operands[0] == last && shares_buffer(E, c))
        last = c++;
    if (c >= g->n_values) return -1;
    const ir_value *cast = V(E, c);
    if (cast->op != OP_CAST || cast->operands[0] != last || cast->phase != v->phase || cast->stage != v->stage ||
        ir_numel(T(E, c)) != ir_numel(T(E, v->id)) || dm_made_at_create(E->plan, c) || !cg_buffers_apart(E, c, v->id))
        return -1;
    for (int k = 0; k < v->n_operands; k++)
        if (V(E, v->operands[k])->op != OP_CONST && !cg_buffers_apart(E, c, v->operands[k])) return -1;
    const ir_value *grad = runs_norm_grad(E, v); /* its pass reads the gradient's operands */
    for (int k = 0; grad && k < grad->n_operands; k++)
        if (!cg_buffers_apart(E, c, grad->operands[k])) return -1;
    return c;
}

int cg_cast_only_reader(const emitter *E, const ir_value *v, int c) {
    /* fused_cast_of's chain: v, the reshapes sharing its buffer, then c, one after the
     * other, each read by the next alone */
    for (int id = v->id; id < c; id++)
        if (V(E, id)->role != ROLE_TEMP || E->reads[id] != 1) return 0;
    return 1;
}

int cast_made_by_producer(const emitter *E, const ir_value *cast) {
    const ir_value *made = dm_cast_producer(E->g, cast);
    return made && fused_cast_of(E, made) == cast->id;
}

/* A cast that its producer does not store, right before a sum_to of the same f32 tensor
 * (a linear layer's bias gradient: the gradient's bf16 copy for the products, and its sum
 * over the rows): the sum's loop stores the copy as it reads each element, so that the
 * tensor is read once and the cast's loop is not written. The cast is made one op later
 * than its place, where nothing has read it yet; its buffer, in use from its place, is
 * apart from the sum's. The sum adds the same terms in the same order, and the copy holds
 * the same roundings: the bits do not change. */
int cast_summed_with(const emitter *E, const ir_value *cast) {
    const ir_graph *g = E->g;
    /* g->casts_with_producer: not under --no-fuse-casts, which writes every cast's loop */
    if (!E->dialect->can.cast_with_sum || !g->casts_with_producer || cast->op != OP_CAST || cast->id + 1 >= g->n_values ||
        cast_made_by_producer(E, cast))
        return -1;
    const ir_value *sum = V(E, cast->id + 1), *x = V(E, cast->operands[0]);
    if (sum->op != OP_SUM_TO || sum->operands[0] != x->id || x->type.dtype != DT_F32 || sum->phase != cast->phase ||
        sum->stage != cast->stage || sum->segment != cast->segment || ir_numel(T(E, cast->id)) != ir_numel(T(E, x->id)) ||
        dm_made_at_create(E->plan, cast->id) || dm_made_at_create(E->plan, sum->id) || sum_made_elsewhere(E, sum))
        return -1;
    return sum->id;
}

int cast_stored_by_sum(const emitter *E, const ir_value *sum) {
    if (sum->op != OP_SUM_TO || sum->id == 0) return -1;
    const ir_value *cast = V(E, sum->id - 1);
    return cast_summed_with(E, cast) == sum->id ? cast->id : -1;
}
