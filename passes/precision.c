/* precision.c: mixed precision (--precision bf16). Every matrix product reads its two
 * operands in g->product_dtype: an f32 operand is read through a cast op, made just before
 * the first product of its stage and phase that reads it and shared by that phase's later
 * products there. The backward's products read an activation through the forward's cast
 * (the activation is kept for the backward in 2 bytes, as PyTorch's autocast saves a
 * linear's bf16 input; the f32 one dies after the forward unless another op reads it). So
 * does a weight's when the step is one micro-batch; with micro-batches the backward casts
 * the weight again rather than keep a copy per micro-batch in flight.
 * The product is accumulated and stored in f32, so everything else (norms, softmax, the
 * loss, gradients, their reduction and the update on f32 master weights) stays f32.
 * Fused attention's operands are left f32 here: a target that runs it in 16 bits
 * (g->attention_16bit: CUDA through cuDNN, bf16 and fp16; the C target's bf16 tile products)
 * rounds them in its kernel's scratch, so that the op, its lse and its gradients keep one
 * layout; elsewhere (the C target's fp16) the attention multiplies in f32.
 *
 * Where the target's kernels can store the rounded copy as they write a value
 * (g->casts_with_producer: the C target), an activation's cast is made right after the op
 * that makes it, when that op is in its first product's function and segment, so that
 * code generation can fold the cast into that op's loop (one pass over the elements, the
 * f32 value not read again); elsewhere it is made just before that product.
 *
 * Where the target's cross-entropy gradient can write 16 bits (g->loss_grad_16bit: both
 * targets), the classifier's gradient that only products read is made in the products'
 * type instead of cast: each value rounded once from the same f32 value, and the logits'
 * gradient never held in f32 (GPT-2 124M at B=8: 1.6 GB and a pass over it fewer).
 *
 * requires: the final op order, stages and phases (pipeline, zero_gather); renumbers values
 * (and the value ids in pipe and reshards). Memory and cost count the casts' 2-byte buffers. */
#include <stdlib.h>

#include "passes.h"

/* A cast made: where it runs, and the one made before it of the same value. */
typedef struct cast_key {
    int phase, stage;
    int cast;     /* new id of the cast */
    int previous; /* index in the list of the same value's previous cast, or -1 */
} cast_key;

/* The cast of `source` reader may read (first: the index of source's latest cast, or -1).
 * The backward reads the forward's cast of an activation always, and of a weight when the
 * step is one micro-batch (keep_weights): one 16-bit copy of it then lives across the
 * forward and backward, where micro-batches in flight would each keep one. */
static int find_cast(const cast_key *made, int first, const ir_value *source, const ir_value *reader,
                     int keep_weights) {
    int activation = source->role != ROLE_PARAM && source->op != OP_PARAM_VIEW;
    for (int i = first; i >= 0; i = made[i].previous) {
        if (made[i].stage != reader->stage) continue;
        if (made[i].phase == (int)reader->phase ||
            ((activation || keep_weights) && made[i].phase == PHASE_FORWARD && reader->phase == PHASE_BACKWARD))
            return made[i].cast;
    }
    return -1;
}

/* The cast of old value `source` (now new id `at`) for product `reader`, appended. */
static int append_cast(ir_graph *g, const ir_value *source, int at, const ir_value *reader) {
    ir_value *c = ir_add(g, OP_CAST, &at, 1, reader->loc);
    c->type = source->type;
    c->type.dtype = g->product_dtype;
    c->name = ir_internf(g, "%s.%s", source->name ? source->name : "product_operand", ir_dtype_name(g->product_dtype));
    c->role = ROLE_TEMP;
    c->phase = reader->phase;
    c->stage = reader->stage;
    c->origin = reader->origin;
    c->segment = reader->segment;
    c->marked = reader->marked;
    return c->id;
}

/* Whether the cast of activation `source` for its first product `reader` is made right
 * after source (see above): source made by an elementwise op, a transpose, a reshape (of
 * one) or a layernorm or its input gradient, in reader's function and segment. */
static int cast_with_producer(const ir_graph *g, const ir_value *source, const ir_value *reader) {
    if (!g->casts_with_producer || source->role != ROLE_TEMP) return 0;
    if (source->phase != reader->phase || source->stage != reader->stage || source->segment != reader->segment ||
        source->marked != reader->marked)
        return 0;
    switch (ir_op_info_of(source->op)->cls) {
    case OPC_UNARY:
    case OPC_UNARY_GRAD:
    case OPC_BINARY:
    case OPC_TRANSPOSE: return 1;
    case OPC_RESHAPE: return source->op != OP_PARAM_VIEW;
    case OPC_NORM: return source->op == OP_LAYERNORM || source->op == OP_LAYERNORM_GRAD;
    default: return 0;
    }
}

/* Whether the classifier's gradient v (old value i) is made in the products' type: the
 * target writes it so (g->loss_grad_16bit) and only products read it, so no f32 copy of
 * the logits' gradient is ever held (gpt.dm's tied head: its two products). */
static int loss_grad_in_16bit(const ir_graph *g, ir_value *const *old, int n, int i) {
    const ir_value *v = old[i];
    if (!g->loss_grad_16bit || v->op != OP_CROSS_ENTROPY_GRAD || v->role != ROLE_TEMP || v->type.dtype != DT_F32) return 0;
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] == i) return 0;
    int read = 0;
    for (int r = i + 1; r < n; r++)
        for (int k = 0; k < old[r]->n_operands; k++) {
            if (old[r]->operands[k] != i) continue;
            if (old[r]->op != OP_MATMUL) return 0;
            read = 1;
        }
    return read;
}

int pass_precision(ir_graph *g, dm_pipeline_plan *pipe, dm_reshard_list *reshards) {
    if (g->product_dtype == DT_F32) return 0;
    int n = g->n_values, n_made = 0;
    ir_value **old = g->values;
    int *map = malloc(((size_t)n + 1) * sizeof(int));
    int *latest = malloc(((size_t)n + 1) * sizeof(int)); /* (old values) its latest cast in made, or -1 */
    cast_key *made = malloc(((size_t)2 * n + 1) * sizeof *made);
    int *first_reader = malloc(((size_t)n + 1) * sizeof(int)); /* (old values) the first product reading it in f32, or -1 */
    if (!map || !latest || !made || !first_reader) abort();
    for (int i = 0; i < n; i++) latest[i] = first_reader[i] = -1;
    for (int i = 0; i < n; i++)
        if (loss_grad_in_16bit(g, old, n, i)) old[i]->type.dtype = g->product_dtype;
    for (int i = 0; i < n; i++)
        for (int k = 0; old[i]->op == OP_MATMUL && k < old[i]->n_operands; k++) {
            int o = old[i]->operands[k];
            if (old[o]->type.dtype == DT_F32 && first_reader[o] < 0) first_reader[o] = i;
        }
    g->values = NULL;
    g->n_values = g->cap_values = 0;
    for (int i = 0; i < n; i++) {
        ir_value *v = old[i];
        for (int k = 0; k < v->n_operands; k++) {
            int o = v->operands[k];
            if (v->op != OP_MATMUL || old[o]->type.dtype != DT_F32) {
                v->operands[k] = map[o];
                continue;
            }
            int cast = find_cast(made, latest[o], old[o], v, g->microbatches <= 1);
            if (cast < 0) {
                cast = append_cast(g, old[o], map[o], v);
                made[n_made] = (cast_key){.phase = (int)v->phase, .stage = v->stage, .cast = cast, .previous = latest[o]};
                latest[o] = n_made++;
            }
            v->operands[k] = cast;
        }
        ir_append_value(g, v);
        map[i] = v->id;
        int reader = first_reader[i];
        if (reader >= 0 && cast_with_producer(g, v, old[reader])) {
            int cast = append_cast(g, v, v->id, old[reader]);
            made[n_made] = (cast_key){.phase = (int)old[reader]->phase, .stage = old[reader]->stage, .cast = cast, .previous = latest[i]};
            latest[i] = n_made++;
        }
    }
    free(old);
    ir_renumber_lists(g, map);
    dm_plans_renumber(map, pipe, reshards);
    free(map);
    free(latest);
    free(made);
    free(first_reader);
    return 0;
}
