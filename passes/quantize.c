/* quantize.c: which weights --quantize stores narrow (docs/compression.md): the code
 * generator's (codegen/emit_quant.c) and --explain's (explain_quant.c) one rule. */
#include "passes.h"

int dm_quantized_weight_of(const ir_graph *g, const ir_value *v) {
    if (v->op != OP_MATMUL || v->phase != PHASE_FORWARD || v->trans_a || v->trans_b || v->batch_dims) return -1;
    const ir_value *b = g->values[v->operands[1]];
    int reads = b->role == ROLE_PARAM && b->type.rank == 2 && b->type.dtype == DT_F32 &&
                g->values[v->operands[0]]->type.dtype == DT_F32;
    return reads ? v->operands[1] : -1;
}
