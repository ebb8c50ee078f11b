/* batch_rows.c: which ops combine rows of the batch (batch_rows.h). */
#include "batch_rows.h"

#include <string.h>

int ir_batch_dim_at(const ir_type *t, const char *name) {
    int at = -1;
    for (int d = 0; d < t->rank; d++)
        if (t->dim_name[d] && strcmp(t->dim_name[d], name) == 0) at = at == -1 ? d : -2;
    return at;
}

int ir_mixes_rows(const ir_graph *g, const ir_value *v, const char *batch) {
    int at = ir_batch_dim_at(&v->type, batch);
    if (at == -2 || at > 0) return 1;
    for (int k = 0; k < v->n_operands; k++) {
        const ir_type *t = &g->values[v->operands[k]]->type;
        int in = ir_batch_dim_at(t, batch);
        if (in == -1) continue;
        if (at == -1 || in != 0 || t->shape[0] != v->type.shape[0]) return 1;
        /* a product contracts A's last dim and B's second last: a batch there is summed over */
        if (v->op == OP_MATMUL && (k == 0 ? t->rank == 1 : t->rank <= 2)) return 1;
    }
    if (at != 0) return 0;
    switch (ir_op_info_of(v->op)->cls) {
    case OPC_SOFTMAX:
    case OPC_SLICE: return v->axis == 0;
    case OPC_MASK: return v->type.rank <= 2; /* over the last two dims */
    case OPC_NORM: return v->type.rank == 1; /* over the last dim */
    default: return 0;
    }
}
