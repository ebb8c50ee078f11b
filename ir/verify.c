/* verify.c: IR invariants, checked between passes in debug builds.
 * requires nothing; breaks nothing. */
#include "ir.h"

int ir_verify(const ir_graph *g, const char *after_pass, FILE *err) {
    int problems = 0;
#define BROKEN(v, ...) do { fprintf(err, "dmc: internal error: IR after %s: %%%d: ", after_pass, (v)->id); \
        fprintf(err, __VA_ARGS__); fputc('\n', err); problems++; } while (0)
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        const ir_op_info *info = ir_op_info_of(v->op);
        if (v->id != i) BROKEN(v, "id %d at index %d", v->id, i);
        if (info->arity >= 0 && v->n_operands != info->arity)
            BROKEN(v, "%s takes %d operands, has %d", info->name, info->arity, v->n_operands);
        for (int k = 0; k < v->n_operands; k++)
            if (v->operands[k] < 0 || v->operands[k] >= i)
                BROKEN(v, "operand %d is %%%d, not an earlier value", k, v->operands[k]);
        if (v->type.rank < 0 || v->type.rank > IR_MAX_RANK) BROKEN(v, "rank %d", v->type.rank);
        for (int d = 0; d < v->type.rank; d++) {
            if (v->type.shape[d] <= 0) BROKEN(v, "dim %d has size %lld", d, (long long)v->type.shape[d]);
            if (v->type.split[d] != IR_REPLICATED && (v->type.split[d] < 0 || v->type.split[d] >= g->n_axes))
                BROKEN(v, "dim %d split over unknown axis %d", d, v->type.split[d]);
        }
        if ((v->role == ROLE_PARAM) != (v->op == OP_PARAM)) BROKEN(v, "param role and op disagree");
        /* 16-bit values are made by a cast (or, g->loss_grad_16bit, the classifier's
         * gradient: passes/precision.c) and read only by products, which read both operands
         * in one dtype (kernels exist for no other mix) */
        for (int k = 0; k < v->n_operands; k++)
            if (ir_dtype_is_half(g->values[v->operands[k]]->type.dtype) && v->op != OP_MATMUL)
                BROKEN(v, "%s reads the 16-bit value %%%d", info->name, v->operands[k]);
        if (ir_dtype_is_half(v->type.dtype) && v->op != OP_CAST && !(v->op == OP_CROSS_ENTROPY_GRAD && g->loss_grad_16bit))
            BROKEN(v, "%s makes a %s value", info->name, ir_dtype_name(v->type.dtype));
        if (v->op == OP_MATMUL && g->values[v->operands[0]]->type.dtype != g->values[v->operands[1]]->type.dtype)
            BROKEN(v, "a product of %s and %s", ir_dtype_name(g->values[v->operands[0]]->type.dtype),
                   ir_dtype_name(g->values[v->operands[1]]->type.dtype));
        if (v->phase > 0 && i > 0 && g->values[i - 1]->phase > v->phase) BROKEN(v, "phase goes backwards");
        if (v->op == OP_ATTENTION_GRAD && v->origin && v->origin->op == OP_ATTENTION &&
            v->origin->heads_inner != v->heads_inner)
            BROKEN(v, "attention_grad's heads_inner %d, its attention's %d", v->heads_inner, v->origin->heads_inner);
        if (v->op == OP_ATTENTION_GRAD && v->origin && v->origin->op == OP_ATTENTION && v->origin->kv_group != v->kv_group)
            BROKEN(v, "attention_grad's kv_group %d, its attention's %d", v->kv_group, v->origin->kv_group);
        if (ir_op_info_of(v->op)->cls == OPC_ATTENTION && v->kv_group > 1 && v->heads_inner)
            BROKEN(v, "%s with kv_group %d and heads_inner", info->name, v->kv_group);
        if (ir_op_info_of(v->op)->cls == OPC_ATTENTION && v->kv_group > 1) {
            const ir_type *q = &g->values[v->operands[0]]->type;
            for (int k = 1; k < 3; k++)
                if (g->values[v->operands[k]]->type.split[q->rank - 3] != q->split[q->rank - 3])
                    BROKEN(v, "%s's grouped heads split unlike q's in operand %d", info->name, k);
        }
    }
    for (int p = 0; p < g->n_params; p++)
        if (g->params[p] < 0 || g->params[p] >= g->n_values || g->values[g->params[p]]->op != OP_PARAM)
            fprintf(err, "dmc: internal error: IR after %s: params[%d] is not a param\n", after_pass, p), problems++;
    if (g->loss >= 0 && (g->loss >= g->n_values || g->values[g->loss]->type.rank != 0))
        fprintf(err, "dmc: internal error: IR after %s: loss is not a scalar\n", after_pass), problems++;
#undef BROKEN
    return problems;
}
