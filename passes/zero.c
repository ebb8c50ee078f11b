/* zero.c: ZeRO (weight-update sharding). With g->zero >= 1, every gradient bucket of
 * passes/buckets.c (a run of parameters whose gradients are allreduced over one axis, on
 * one stage, contiguous in ctx->params and ctx->grads alike) is one flat range of
 * `span` elements, a multiple of the axis size k (the memory plan rounds parameters and
 * gradients so): instead of allreducing it, the update reduce-scatters it, so that the
 * rank at coordinate c holds the summed gradient of elements [c * span / k, (c + 1) *
 * span / k) of the range, updates those elements of the parameters with optimizer state
 * for them alone, and all-gathers the parameters in place. This is the sharding of the
 * flat parameter vector over the axis (DeepSpeed's and FSDP's flat partition): a share
 * may begin and end inside a tensor, so no dimension has to divide by k.
 *   zero 1: the optimizer state is the shares only (1/k of it per rank);
 *   zero 2: the gradients too: a bucket is assembled whole in ctx->scratch and
 *           reduce-scattered into the rank's share of ctx->grads;
 *   zero 3: the parameters too, for the buckets passes/zero_gather.c gathers (every one
 *           but those of parameters tied across pipeline stages): ctx->params holds the
 *           rank's share, updated in place, and no all-gather follows the update.
 * The same bytes cross the links as the allreduce (a reduce-scatter and an all-gather).
 * Interleaved, a bucket is one chunk's (a stage's): its shares are laid out in the stage's
 * part of its rank's regions, the parts one after the other as memory_stages.c stacks them.
 *
 * requires: memory (and memory_plan_stages), buckets; rewrites the memory plan's
 * optimizer state (and, for zero 2, gradient) layout: members' state values get no
 * storage of their own (REGION_NONE), their gradients' offsets become -1 (the buckets
 * reach them by range), and plan->sum_offset keeps the whole layout (the micro-batches'
 * gradient sums', and zero 1's ctx->grads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int64_t align16(int64_t n) { return (n + 15) / 16 * 16; } /* the memory plan's alignment */

/* The buckets: one per lead of the bucket plan whose members sit alike in ctx->params
 * and ctx->grads (a tied parameter's copy between them breaks that: such a bucket keeps
 * its allreduce). */
static void find_buckets(const ir_graph *g, const dm_memory_plan *mem, const dm_bucket_plan *buckets, dm_zero_plan *z) {
    for (int lead = 0; lead < g->n_values; lead++) {
        int first = -1, last = -1, alike = 1;
        for (int p = 0; p < g->n_params; p++) {
            int grad = g->grads ? g->grads[p] : -1;
            if (grad < 0 || buckets->lead[grad] != lead) continue;
            if (first < 0) first = p;
            else if (mem->offset[g->params[p]] - mem->offset[g->params[first]] != mem->offset[grad] - mem->offset[g->grads[first]])
                alike = 0;
            last = p;
        }
        if (first < 0 || !alike) continue;
        const ir_value *l = g->values[lead], *end_param = g->values[g->params[last]];
        int64_t k = g->axes[l->mesh_axis].size;
        dm_zero_bucket b = {.lead = lead, .axis = (int)l->mesh_axis, .stage = g->values[g->params[first]]->stage,
                            .first = first, .last = last, .grad_begin = mem->offset[g->grads[first]],
                            .param_begin = mem->offset[g->params[first]], .grad_at = -1, .param_at = -1};
        for (int p = first; p <= last; p++) z->range_at[p] = mem->offset[g->grads[p]] - b.grad_begin;
        /* the last member's allocation, rounded to a multiple of k, ends the range */
        int64_t end = mem->offset[g->grads[last]] + ir_local_numel(g, &end_param->type);
        int64_t span = end - b.grad_begin;
        b.span = (span + k - 1) / k * k;
        b.share = b.span / k;
        b.state_stride = align16(b.share);
        z->bucket = ir_grow(z->bucket, z->n_buckets, sizeof *z->bucket);
        z->bucket[z->n_buckets++] = b;
        for (int p = first; p <= last; p++) z->bucket_of[p] = z->n_buckets - 1;
    }
}

/* ZeRO 3: marks the buckets whose parameters the graph gathers (zero_gather ops of
 * passes/zero_gather.c) as held in shares (param_at 0, placed by relayout_params); each
 * gather must cover its bucket and each view find its parameter where the update puts it. */
static void mark_gathered(const ir_graph *g, dm_zero_plan *z) {
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        if (v->op == OP_ZERO_GATHER) {
            int p = g->values[v->operands[0]]->param_index, k = z->bucket_of[p];
            dm_zero_bucket *b = k >= 0 ? &z->bucket[k] : NULL;
            if (!b || b->first != p || ir_numel(&v->type) != b->span || v->n_operands != b->last - b->first + 1) {
                fprintf(stderr, "dmc: internal error: '%s' gathers %lld elements of %d parameters, not a ZeRO bucket\n",
                        v->name, (long long)ir_numel(&v->type), v->n_operands);
                abort();
            }
            b->param_at = 0;
        }
        if (v->op == OP_PARAM_VIEW && v->offset != z->range_at[v->param_index]) {
            fprintf(stderr, "dmc: internal error: '%s' is gathered at %lld of its range but updated at %lld\n", v->name,
                    (long long)v->offset, (long long)z->range_at[v->param_index]);
            abort();
        }
    }
}

static void stack_stages(const dm_memory_plan *mem, const int64_t *size, int64_t *base, int64_t *rank_size);

/* ZeRO 3, interleaved: each stage's part of ctx->params (its parameters, the copies it
 * holds and its buckets' shares, laid out from 0 by relayout_params) moved to where it
 * starts in its rank's region. */
static void restack_params(const ir_graph *g, dm_memory_plan *mem, dm_zero_plan *z) {
    int S = mem->stages;
    int64_t *size = calloc((size_t)S, sizeof(int64_t)), *base = calloc((size_t)S, sizeof(int64_t));
    int64_t *rank_size = calloc((size_t)mem->ranks, sizeof(int64_t));
    if (!size || !base || !rank_size) abort();
    for (int s = 0; s < S; s++) size[s] = mem->stage[s].param_elems;
    stack_stages(mem, size, base, rank_size);
    for (int i = 0; i < g->n_values; i++) {
        if (mem->region[i] != REGION_PARAMS || mem->storage_of[i] != i) continue;
        if (mem->offset[i] >= 0) mem->offset[i] += base[g->values[i]->stage];
        for (int k = mem->copy_first[i]; k < mem->copy_first[i + 1]; k++) mem->copy_offset[k] += base[mem->copy_stage[k]];
    }
    for (int b = 0; b < z->n_buckets; b++)
        if (z->bucket[b].param_at >= 0) z->bucket[b].param_at += base[z->bucket[b].stage];
    for (int r = 0; r < mem->ranks; r++) mem->rank[r].param_elems = rank_size[r];
    free(size);
    free(base);
    free(rank_size);
}

/* ZeRO 3: ctx->params again, stage by stage: the parameters outside gathered buckets
 * (and the copies of tied ones the stage holds) in their order, then each gathered
 * bucket's share. Members lose their storage. */
static void relayout_params(const ir_graph *g, dm_memory_plan *mem, dm_zero_plan *z) {
    int S = mem->stages > 1 ? mem->stages : 1;
    int64_t most = 0;
    for (int s = 0; s < S; s++) {
        int64_t top = 0;
        for (int i = 0; i < g->n_values; i++) {
            const ir_value *v = g->values[i];
            if (mem->region[i] != REGION_PARAMS || mem->storage_of[i] != i) continue;
            int64_t size = dm_persistent_elems(g, ir_local_numel(g, &v->type));
            int own = S == 1 || v->stage == s;
            int b = v->param_index >= 0 ? z->bucket_of[v->param_index] : -1;
            if (own && b >= 0 && z->bucket[b].param_at >= 0) {
                mem->offset[i] = -1;
                continue;
            }
            if (own) {
                mem->offset[i] = top;
                top += size;
                continue;
            }
            for (int k = mem->copy_first[i]; k < mem->copy_first[i + 1]; k++)
                if (mem->copy_stage[k] == s) {
                    mem->copy_offset[k] = top;
                    top += size;
                }
        }
        for (int b = 0; b < z->n_buckets; b++) {
            dm_zero_bucket *zb = &z->bucket[b];
            if (zb->param_at < 0 || (S > 1 && zb->stage != s)) continue;
            zb->param_at = top;
            top += zb->state_stride;
        }
        if (S > 1) mem->stage[s].param_elems = top;
        if (top > most) most = top;
    }
    mem->param_elems = most;
    if (mem->rank) restack_params(g, mem, z);
    for (int i = 0; i < g->n_values; i++)
        if (mem->region[i] == REGION_PARAMS && mem->offset[i] < 0) mem->region[i] = REGION_NONE;
}

/* Interleaved (mem->rank set), a rank holds its chunks' stages one after the other, as
 * memory_stages.c stacks them: where stage k's part of a region of size[k] starts in its
 * rank's (base[k]), and each rank's total into rank_size[r]. */
static void stack_stages(const dm_memory_plan *mem, const int64_t *size, int64_t *base, int64_t *rank_size) {
    for (int r = 0; r < mem->ranks; r++) {
        int64_t at = 0;
        for (int k = r; k < mem->stages; k += mem->ranks) base[k] = at, at += size[k];
        rank_size[r] = at;
    }
}

/* Lays out region (state or gradients) again, stage by stage: the values of parameters
 * outside the buckets in their order, then each bucket's shares (`per_bucket` tensors of
 * a share each). Members' values lose their storage. Interleaved, each stage's part is then
 * moved to where it starts in its rank's region. */
static void relayout(const ir_graph *g, dm_memory_plan *mem, dm_zero_plan *z, dm_region region, int per_bucket) {
    int S = mem->stages > 1 ? mem->stages : 1;
    int64_t *top = calloc((size_t)S, sizeof(int64_t)), *base = calloc((size_t)S, sizeof(int64_t));
    int *param_of = malloc(((size_t)g->n_values + 1) * sizeof(int)), *stage_of = malloc(((size_t)g->n_values + 1) * sizeof(int));
    if (!top || !base || !param_of || !stage_of) abort();
    for (int i = 0; i < g->n_values; i++) param_of[i] = region == REGION_STATE ? g->values[i]->param_index : -1;
    for (int p = 0; region == REGION_GRADS && p < g->n_params; p++)
        if (g->grads[p] >= 0) param_of[g->grads[p]] = p;
    for (int i = 0; i < g->n_values; i++) {
        const ir_value *v = g->values[i];
        stage_of[i] = 0;
        if (mem->region[i] != region || mem->storage_of[i] != i) continue;
        int p = param_of[i] >= 0 && param_of[i] < g->n_params ? param_of[i] : -1;
        int s = S > 1 ? (p >= 0 ? g->values[g->params[p]]->stage : v->stage) : 0;
        if (p >= 0 && z->bucket_of[p] >= 0) {
            if (region == REGION_STATE) mem->region[i] = REGION_NONE;
            mem->offset[i] = -1;
            continue;
        }
        stage_of[i] = s;
        mem->offset[i] = top[s];
        top[s] += align16(ir_local_numel(g, &v->type));
    }
    for (int b = 0; b < z->n_buckets; b++) {
        dm_zero_bucket *zb = &z->bucket[b];
        int s = S > 1 ? zb->stage : 0;
        if (region == REGION_STATE) zb->state_at = top[s];
        else zb->grad_at = top[s];
        top[s] += (int64_t)per_bucket * zb->state_stride;
    }
    for (int s = 0; s < S; s++) {
        int64_t *elems = region == REGION_STATE ? (S > 1 ? &mem->stage[s].state_elems : &mem->state_elems)
                                                : (S > 1 ? &mem->stage[s].grad_elems : &mem->grad_elems);
        *elems = top[s];
    }
    if (mem->rank) { /* interleaved: the stages' parts stacked in their ranks' regions */
        int64_t *rank_size = calloc((size_t)mem->ranks, sizeof(int64_t));
        if (!rank_size) abort();
        stack_stages(mem, top, base, rank_size);
        for (int i = 0; i < g->n_values; i++)
            if (mem->region[i] == region && mem->storage_of[i] == i && mem->offset[i] >= 0) mem->offset[i] += base[stage_of[i]];
        for (int b = 0; b < z->n_buckets; b++) {
            dm_zero_bucket *zb = &z->bucket[b];
            if (region == REGION_STATE) zb->state_at += base[zb->stage];
            else zb->grad_at += base[zb->stage];
        }
        for (int r = 0; r < mem->ranks; r++) {
            if (region == REGION_STATE) mem->rank[r].state_elems = rank_size[r];
            else mem->rank[r].grad_elems = rank_size[r];
        }
        free(rank_size);
    }
    /* values sharing a buffer (reshapes) follow it */
    for (int i = 0; i < g->n_values; i++) {
        int root = mem->storage_of[i];
        if (root == i || mem->region[i] != region) continue;
        mem->region[i] = mem->region[root];
        mem->offset[i] = mem->offset[root] < 0 ? -1 : mem->offset[root] + mem->within[i];
    }
    if (S > 1) {
        int64_t most = 0;
        for (int s = 0; s < S; s++) {
            int64_t e = region == REGION_STATE ? mem->stage[s].state_elems : mem->stage[s].grad_elems;
            if (e > most) most = e;
        }
        if (region == REGION_STATE) mem->state_elems = most;
        else mem->grad_elems = most;
    }
    free(top);
    free(base);
    free(param_of);
    free(stage_of);
}

int pass_zero(const ir_graph *g, dm_memory_plan *mem, const dm_bucket_plan *buckets, dm_zero_plan *z) {
    memset(z, 0, sizeof *z);
    z->stage = g->zero;
    z->bucket_of = malloc(((size_t)g->n_params + 1) * sizeof(int));
    z->update_of = malloc(((size_t)g->n_params + 1) * sizeof(int));
    z->range_at = malloc(((size_t)g->n_params + 1) * sizeof(int64_t));
    if (!z->bucket_of || !z->update_of || !z->range_at) abort();
    for (int p = 0; p < g->n_params; p++) z->bucket_of[p] = z->update_of[p] = -1, z->range_at[p] = -1;
    for (int i = 0; i < g->n_values; i++)
        if (ir_op_info_of(g->values[i]->op)->cls == OPC_UPDATE) z->update_of[g->values[i]->param_index] = i;
    if (!g->zero || !g->grads || g->optimizer.kind == OPTIM_NONE) return 0;
    find_buckets(g, mem, buckets, z);
    if (!z->n_buckets) return 0;
    /* the optimizer state tensors: an update's operands after the parameter and gradient */
    int first_update = z->update_of[z->bucket[0].first];
    z->states = first_update >= 0 ? g->values[first_update]->n_operands - 2 : 0;
    /* the whole gradient layout, for the micro-batches' sums */
    mem->sum_offset = malloc(((size_t)g->n_values + 1) * sizeof(int64_t));
    if (!mem->sum_offset) abort();
    memcpy(mem->sum_offset, mem->offset, (size_t)g->n_values * sizeof(int64_t));
    for (int s = 0; mem->stages > 1 && s < mem->stages; s++) mem->stage[s].grad_sum_elems = mem->stage[s].grad_elems;
    mem->grad_sum_elems = mem->grad_elems;
    relayout(g, mem, z, REGION_STATE, z->states);
    if (g->zero >= 3) {
        mark_gathered(g, z);
        relayout_params(g, mem, z);
    }
    if (g->zero >= 2) {
        relayout(g, mem, z, REGION_GRADS, 1);
    } else {
        /* whole in ctx->grads, but reduced only in this rank's share: no offset to hand out */
        for (int p = 0; p < g->n_params; p++)
            if (z->bucket_of[p] >= 0) mem->offset[g->grads[p]] = -1;
    }
    for (int b = 0; b < z->n_buckets; b++) {
        /* zero 1 receives its share; zero 2 assembles the whole range there */
        int64_t need = g->zero >= 2 ? z->bucket[b].span : z->bucket[b].share;
        /* and after it, a 16-bit reduce-scatter's work (dmrt_reduce_scatter_half_work) */
        if (dm_zero_reduces_half(g, z->bucket[b].axis))
            need += 2 * g->axes[z->bucket[b].axis].size * ((z->bucket[b].share + 1) / 2);
        if (need > z->scratch_elems) z->scratch_elems = need;
    }
    return 0;
}

void dm_zero_plan_free(dm_zero_plan *z) {
    free(z->bucket);
    free(z->bucket_of);
    free(z->update_of);
    free(z->range_at);
    memset(z, 0, sizeof *z);
}
