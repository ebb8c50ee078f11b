/* buckets.c: gradient buckets. The update phase allreduces each parameter's pending
 * gradient over an axis (data parallelism); gradients live in ctx->grads in declaration
 * order, so a run of consecutive parameters whose gradients are allreduced over the same
 * axis, on the same pipeline stage, is one contiguous range: each partial is copied into
 * its gradient's place and the range is reduced by one call, up to bucket_floats (25 MiB
 * by default; the first, holding the last parameters, at most 1 MiB: PyTorch DDP's
 * sizes). Fewer, larger messages: each collective synchronises the ranks once. The
 * padding between gradients is zero and stays zero.
 *
 * A bucket whose partials are all complete before the backward pass ends is started
 * there, right after the last of them, and waited for at the end of the pass: the
 * backward pass computes the earlier layers' gradients in reverse order, so the later
 * layers' buckets are reduced while it goes on. With micro-batches the gradients are
 * complete only after the last one, so every bucket is reduced in the update; with ZeRO
 * (passes/zero.c), gradient compression (passes/compress.c) and parameter servers
 * (codegen/emit_ps.c: a bucket's gradients are put in place and pushed with the rest) too.
 *
 * requires: shard, pipeline (stages), memory (gradients in REGION_GRADS); breaks nothing. */
#include <stdlib.h>

#include "passes.h"

static int grad_allreduce(const ir_graph *g, const dm_memory_plan *mem, int p) {
    if (!g->grads || g->grads[p] < 0) return 0;
    const ir_value *v = g->values[g->grads[p]];
    return v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE && (!mem || mem->region[v->id] == REGION_GRADS);
}

int pass_buckets(const ir_graph *g, const dm_memory_plan *mem, int64_t bucket_floats, dm_bucket_plan *plan) {
    plan->lead = malloc(((size_t)g->n_values + 1) * sizeof(int));
    plan->ready = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!plan->lead || !plan->ready) abort();
    for (int i = 0; i < g->n_values; i++) plan->lead[i] = plan->ready[i] = -1;
    if (bucket_floats <= 0) bucket_floats = DM_BUCKET_FLOATS;
    int early = dm_buckets_start_in_backward(g, ir_pipeline_axis(g) >= 0 ? 2 : 1, g->microbatches);
    /* the last backward op: a bucket complete only then has nothing to overlap */
    int last_backward = -1;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->phase == PHASE_BACKWARD && ir_op_info_of(g->values[i]->op)->cls != OPC_SOURCE) last_backward = i;
    int64_t cap = DM_FIRST_BUCKET_FLOATS < bucket_floats ? DM_FIRST_BUCKET_FLOATS : bucket_floats;
    for (int q = g->n_params; q > 0;) {
        if (!grad_allreduce(g, mem, q - 1)) {
            q--;
            continue;
        }
        const ir_value *last = g->values[g->grads[q - 1]];
        int64_t floats = ir_local_numel(g, &last->type);
        int p = q - 1; /* the bucket is parameters [p, q) */
        while (p > 0 && grad_allreduce(g, mem, p - 1)) {
            const ir_value *prev = g->values[g->grads[p - 1]];
            int64_t more = ir_local_numel(g, &prev->type);
            if (prev->mesh_axis != last->mesh_axis || prev->stage != last->stage || floats + more > cap) break;
            floats += more;
            p--;
        }
        /* the lead is the member the update phase reaches first */
        int first = g->grads[p], ready = -1, in_backward = 1;
        for (int k = p; k < q; k++) {
            if (g->grads[k] < first) first = g->grads[k];
            int partial = g->values[g->grads[k]]->operands[0];
            if (partial > ready) ready = partial;
            if (g->values[partial]->phase != PHASE_BACKWARD) in_backward = 0;
        }
        for (int k = p; k < q; k++) plan->lead[g->grads[k]] = first;
        if (in_backward && ready < last_backward && early) plan->ready[first] = ready;
        cap = bucket_floats;
        q = p;
    }
    return 0;
}

int dm_buckets_start_in_backward(const ir_graph *g, int stages, int microbatches) {
    return stages <= 1 && microbatches <= 1 && !g->zero && dm_compress_axis(g) < 0 && !g->param_servers.servers;
}

void dm_bucket_plan_free(dm_bucket_plan *plan) {
    free(plan->lead);
    free(plan->ready);
    plan->lead = plan->ready = NULL;
}
