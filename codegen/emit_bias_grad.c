/* emit_bias_grad.c: a linear layer's bias gradient summed by its weight gradient's product
 * (can.gemm_bias_grad; C: dmrt_sum_rows_split beside the product; CUDA: cuBLASLt's BGRADA
 * epilogue in the product's kernel; cg_gemm.bias_grad).
 *
 * For y = x @ weight + bias, autodiff makes the bias's gradient as sum_to(dy) over every
 * dim but the last, and the weight's as the product x^T @ dy, whose k runs over the same
 * rows of dy. The product can sum them as it reads them: the sum's own pass over dy (two
 * kernels on the GPU, a long sum split in chunks) is not written.
 *
 * The sum comes first in the program (the input's gradient is made between the two), so
 * the product is made at the sum's place, earlier than its own: both its operands are made
 * by then (dy is the sum's operand; x must be made before the sum), and its result must
 * land where nothing in use between the two places lies (cg_may_make_early): a gradient's
 * buffer (or its window of one: gpt.dm's q, k and v weights are windows of c_attn's), or,
 * for a data-parallel rank's partial gradient, an arena buffer apart from every live one.
 * Not folded: pipelines, micro-batches and ZeRO (their gradients are summed, sent or
 * sharded in between), products that accumulate into a sum or are quantized, and 16-bit
 * products: they read dy's 16-bit copy, and a bias gradient summed from it would differ
 * from the f32 sum that every other mesh makes (a pipeline's, say), so one program's
 * gradient would depend on its mesh. */
#include <stdlib.h>

#include "emitter.h"

/* Whether v sums every dim of its f32 operand but the last. (It is written at its own
 * place either way: where its buffer lies does not matter.) */
static int sums_rows(const emitter *E, const ir_value *v) {
    if (v->op != OP_SUM_TO) return 0;
    const ir_type *t = T(E, v->id), *dy = T(E, v->operands[0]);
    return t->rank == 1 && t->dtype == DT_F32 && dy->rank >= 2 && dy->dtype == DT_F32 &&
           dy->shape[dy->rank - 1] == t->shape[0] && v->axes == (1u << (dy->rank - 1)) - 1u &&
           !(E->summed && E->summed[v->id] >= 0);
}

int cg_may_make_early(const emitter *E, int place, int value) {
    const ir_value *v = V(E, place), *w = V(E, value);
    int root = E->plan->storage_of[w->id];
    if (E->plan->region[root] == REGION_GRADS) {
        for (int i = v->id + 1; i < w->id; i++)
            if (E->plan->storage_of[i] == root) return 0;
        return 1;
    }
    if (E->plan->region[root] != REGION_ARENA) return 0;
    char *in_use = calloc((size_t)w->id, 1);
    if (!in_use) return 0;
    for (int i = v->id; i < E->g->n_values; i++) {
        const ir_value *u = V(E, i);
        if (i < w->id) in_use[i] = 1;
        for (int o = 0; o < u->n_operands; o++)
            if (u->operands[o] < w->id) in_use[u->operands[o]] = 1;
    }
    int apart = 1;
    for (int x = 0; x < w->id && apart; x++) {
        if (!in_use[x]) continue;
        /* a value sharing w's buffer: another piece of the same assembly (its own window),
         * the assembly's sum, a view; in the way only if made between the two places */
        if (E->plan->storage_of[x] == root) apart = x <= v->id;
        else apart = cg_buffers_apart(E, w->id, x);
    }
    free(in_use);
    return apart;
}

/* Whether product w may be made at v's place and sum v in its call (f32 operands). */
static int product_may_sum(const emitter *E, const ir_value *v, const ir_value *w) {
    const ir_type *a = T(E, w->operands[0]);
    return w->batch_dims == 0 && !w->trans_b && a->dtype == DT_F32 && w->operands[0] < v->id && w->phase == v->phase &&
           w->stage == v->stage && w->segment == v->segment && cg_may_make_early(E, v->id, w->id) &&
           E->plan->bias_add_of[w->id] < 0 && E->plan->sum_add_of[w->id] < 0 && !(E->summed && E->summed[w->id] >= 0) &&
           !is_quant_product(E, w);
}

int product_summing_bias(const emitter *E, const ir_value *v) {
    const ir_graph *g = E->g;
    if (!E->dialect->can.gemm_bias_grad || E->plan->stages > 1 || g->microbatches > 1 || g->zero ||
        !sums_rows(E, v))
        return -1;
    int i = cg_next_reader(E, v->operands[0], v->id, OP_MATMUL, 1);
    return i >= 0 && product_may_sum(E, v, V(E, i)) ? i : -1;
}

int bias_summed_by_product(const emitter *E, const ir_value *w) {
    if (w->op != OP_MATMUL || !E->dialect->can.gemm_bias_grad) return -1;
    int i = cg_last_reader(E, w->operands[1], w->id, OP_SUM_TO, 0);
    return i >= 0 && product_summing_bias(E, V(E, i)) == w->id ? i : -1;
}
