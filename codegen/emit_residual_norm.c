/* emit_residual_norm.c: a residual add made by the layernorm that reads it next
 * (can.residual_norm).
 *
 * The driver sets g->residual_norms from the dialect's capability; dm_residual_add_of
 * (passes/memory.c) names the add right before a layernorm, whose operands the memory plan
 * keeps alive to it, and this file decides whether the layernorm makes it.
 *
 * gpt.dm's blocks add each sublayer's output to the residual stream and normalize the sum
 * next: x_attn = x + attn(ln_1(x)), then ln_2(x_attn). The layernorm's row pass makes the
 * sum itself (each element the same float add, stored for the sum's later readers) and
 * normalizes it while the row is in cache: the add's own pass over three tensors is gone.
 *
 * The layernorm is the op right after the add, so the only buffers written between the
 * add's place and its are the layernorm's result and its 16-bit copy (fused_cast_of); the
 * add's operands, read by the layernorm now, may have died at the add, so the fold is made
 * only where those two buffers are seen to be apart from the operands'. Not folded:
 * pipelines and micro-batches (their stages and micro-batches lay the arena out apart),
 * adds that broadcast an operand (gpt.dm's x = wte + wpe), adds whose result is cast in
 * their own pass or shares another value's buffer. */
#include "emitter.h"

/* Whether operand o of the add is read element for element (its shape, f32, a value). */
static int plain_operand(const emitter *E, const ir_value *add, int o) {
    const ir_type *t = T(E, o), *sum = T(E, add->id);
    if (V(E, o)->op == OP_CONST || t->dtype != DT_F32 || t->rank != sum->rank) return 0;
    for (int d = 0; d < t->rank; d++)
        if (t->shape[d] != sum->shape[d]) return 0;
    return 1;
}

int residual_norm_of(const emitter *E, const ir_value *v) {
    const ir_graph *g = E->g;
    if (v->role != ROLE_TEMP || v->type.dtype != DT_F32 ||
        v->type.partial || E->plan->stages > 1 || g->microbatches > 1 || v->id + 1 >= g->n_values ||
        shares_buffer(E, v->id) || runs_product(E, v) || E->plan->assembled_in[v->id] >= 0 ||
        dm_made_at_create(E->plan, v->id) || fused_cast_of(E, v) >= 0)
        return -1;
    const ir_value *ln = V(E, v->id + 1);
    if (dm_residual_add_of(g, ln) != v) return -1;
    int cast = fused_cast_of(E, ln);
    for (int k = 0; k < 2; k++) {
        int o = v->operands[k];
        if (!plain_operand(E, v, o) || !cg_buffers_apart(E, ln->id, o) || (cast >= 0 && !cg_buffers_apart(E, cast, o)))
            return -1;
    }
    return ln->id;
}

int residual_made_by_norm(const emitter *E, const ir_value *ln) {
    if (ln->op != OP_LAYERNORM) return -1;
    const ir_value *add = V(E, ln->operands[0]);
    return residual_norm_of(E, add) == ln->id ? add->id : -1;
}
