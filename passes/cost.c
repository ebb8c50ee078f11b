/* cost.c: flops and bytes of one op on one rank, and a nominal time for them. The
 * numbers only rank the stages of a cut against each other, so one roofline serves:
 * an op takes the longer of its flops at COST_FLOPS_PER_S and its bytes at
 * COST_BYTES_PER_S (one CPU socket's order of magnitude). */
#include "passes.h"

#define COST_FLOPS_PER_S 1e11
#define COST_BYTES_PER_S 2e10
#define COST_LINK_BYTES_PER_S 1e10   /* between the ranks of two stages */

/* Element operations per element of the result (or of the operand, for reductions). */
static double ops_per_element(const ir_value *v) {
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_SOFTMAX: return 5;
    case OPC_NORM: return 8;
    case OPC_LOSS:
    case OPC_LOSS_GRAD: return 6;
    case OPC_UPDATE: return v->op == OP_ADAMW_UPDATE ? 12 : 4;
    default: return 1;
    }
}

dm_op_cost cost_of_op(const ir_graph *g, const ir_value *v) {
    dm_op_cost c = {0, 0};
    const ir_op_info *info = ir_op_info_of(v->op);
    if (info->cls == OPC_SOURCE) return c;
    double out = v->type.dtype == DT_VOID ? 0 : (double)ir_local_numel(g, &v->type);
    double in = 0;
    for (int k = 0; k < v->n_operands; k++) {
        const ir_value *x = g->values[v->operands[k]];
        if (x->role != ROLE_CONST) in += (double)ir_local_numel(g, &x->type);
    }
    c.bytes = 4.0 * (in + out);
    switch (info->cls) {
    case OPC_MATMUL: {
        const ir_value *a = g->values[v->operands[0]];
        int r = a->type.rank;
        int kdim = v->trans_a ? r - 2 : r - 1;
        int64_t k = a->type.shape[kdim];
        if (a->type.split[kdim] != IR_REPLICATED) k /= g->axes[a->type.split[kdim]].size;
        c.flops = 2.0 * out * (double)k;
        break;
    }
    case OPC_REDUCE:
    case OPC_UPDATE:
    case OPC_LOSS: c.flops = ops_per_element(v) * in; break;
    case OPC_RESHAPE:
    case OPC_TRANSPOSE:
    case OPC_SLICE:
    case OPC_GATHER:
    case OPC_COLLECTIVE: c.flops = 0; break;
    default: c.flops = ops_per_element(v) * out; break;
    }
    return c;
}

double cost_seconds(dm_op_cost c) {
    double compute = c.flops / COST_FLOPS_PER_S, memory = c.bytes / COST_BYTES_PER_S;
    return compute > memory ? compute : memory;
}

/* No latency term: ops have none either, and a latency would outweigh every op of a small
 * model, packing its compute into one stage. */
double cost_link_seconds(double bytes) { return bytes / COST_LINK_BYTES_PER_S; }
