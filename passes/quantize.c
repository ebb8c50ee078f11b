/* quantize.c: which weights --quantize stores narrow (docs/compression.md): the code
 * generator's (codegen/emit_quant.c) and --explain's (explain_quant.c) one rule. */
#include "passes.h"

/* Whether every forward op reading parameter w is a product reading it x @ transpose(w):
 * the one layout its narrow copy then has (a weight an embedding also gathers, gpt.dm's
 * tied head, stays f32). */
static int read_transposed_only(const ir_graph *g, int w) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->phase != PHASE_FORWARD) continue;
        for (int k = 0; k < v->n_operands; k++)
            if (v->operands[k] == w && !(v->op == OP_MATMUL && k == 1 && v->trans_b && !v->trans_a && !v->batch_dims))
                return 0;
    }
    return 1;
}

int dm_weight_held_narrow(const ir_graph *g, int w) {
    if (!g->quantize_narrow_only || g->values[w]->role != ROLE_PARAM) return 0;
    int products = 0;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        for (int k = 0; k < v->n_operands; k++)
            if (v->operands[k] == w) {
                if (k != 1 || dm_quantized_weight_of(g, v) != w) return 0;
                products++;
            }
    }
    return products > 0;
}

int dm_quantized_weight_of(const ir_graph *g, const ir_value *v) {
    if (v->op != OP_MATMUL || v->phase != PHASE_FORWARD || v->trans_a || v->batch_dims) return -1;
    const ir_value *b = g->values[v->operands[1]];
    int reads = b->role == ROLE_PARAM && b->type.rank == 2 && b->type.dtype == DT_F32 &&
                g->values[v->operands[0]]->type.dtype == DT_F32;
    if (!reads || (v->trans_b && !read_transposed_only(g, b->id))) return -1;
    return b->id;
}
