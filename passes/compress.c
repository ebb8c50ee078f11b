/* compress.c: gradient compression on the data axis (--compress). Data parallelism's
 * gradient buckets (passes/buckets.c) over the mesh axis named `data` are reduced by one
 * of the compressed reductions of dmrt_comm.h instead of dmrt_allreduce_sum:
 *   bf16, fp16    16-bit values on the wire, summed in float (exact in rule, not in value);
 *   topk:RATIO    each rank sends the round(RATIO x n) elements of each gradient (at least
 *                 one) largest in magnitude, after adding its error-feedback residual;
 *   powersgd:R    each matrix of a gradient as rank-R factors P and Q, with error
 *                 feedback; vectors, and matrices whose factors are no smaller, exactly.
 * Tensor and pipeline traffic is untouched. The residuals (one per element of a bucket's
 * range) and PowerSGD's Q factors live in ctx->state after the optimizer's state: they are
 * optimizer state (checkpoints hold them, codegen/emit_compress.c: "<param>.error_feedback"
 * a row per data rank, "<param>.powersgd_q" a factor per block of the gradient). The cost model prices a compressed allreduce by what it sends
 * (dm_compress_sent); a bucket's reduction needs scratch (work_elems), as dmrt_comm.h's
 * _work functions compute it.
 *
 * With ZeRO the gradients are reduce-scattered, not allreduced (passes/zero.c): bf16 and
 * fp16 then ride on ZeRO's reduce-scatters (dmrt_reduce_scatter_sum_half,
 * dm_zero_reduces_half) and this pass has nothing to do; top-k and PowerSGD are refused
 * (passes/supported.c).
 *
 * requires: memory (and memory_plan_stages), buckets. Grows the memory plan's state (per
 * stage) and scratch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

int dm_compress_parse(const char *text, ir_compress *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    char *end = NULL;
    if (strcmp(text, "none") == 0) return 0;
    if (strcmp(text, "bf16") == 0) return out->kind = COMPRESS_BF16, 0;
    if (strcmp(text, "fp16") == 0) return out->kind = COMPRESS_FP16, 0;
    if (strncmp(text, "topk:", 5) == 0) {
        double ratio = strtod(text + 5, &end);
        if (end != text + 5 && !*end && ratio > 0 && ratio <= 1) {
            out->kind = COMPRESS_TOPK;
            out->ratio = ratio;
            return 0;
        }
        snprintf(err, errlen, "topk:RATIO takes a fraction in (0, 1], got '%s'", text + 5);
        return -1;
    }
    if (strncmp(text, "powersgd:", 9) == 0) {
        long rank = strtol(text + 9, &end, 10);
        if (end != text + 9 && !*end && rank >= 1 && rank <= 1024) {
            out->kind = COMPRESS_POWERSGD;
            out->rank = (int)rank;
            return 0;
        }
        snprintf(err, errlen, "powersgd:RANK takes an integer from 1 to 1024, got '%s'", text + 9);
        return -1;
    }
    snprintf(err, errlen, "takes bf16, fp16, topk:RATIO, powersgd:RANK or none, got '%s'", text);
    return -1;
}

void dm_compress_name(const ir_compress *c, char *buf, size_t size) {
    switch (c->kind) {
    case COMPRESS_BF16: snprintf(buf, size, "bf16"); break;
    case COMPRESS_FP16: snprintf(buf, size, "fp16"); break;
    case COMPRESS_TOPK: snprintf(buf, size, "topk:%g", c->ratio); break;
    case COMPRESS_POWERSGD: snprintf(buf, size, "powersgd:%d", c->rank); break;
    default: snprintf(buf, size, "none"); break;
    }
}

int dm_compress_axis(const ir_graph *g) {
    return g->compress.kind == COMPRESS_NONE ? -1 : ir_role_axis(g, g->data_axis);
}

/* Whether v is a gradient's allreduce over the compressed axis (the update's). */
static int data_grad_allreduce(const ir_graph *g, const ir_value *v) {
    int axis = dm_compress_axis(g);
    return axis >= 0 && v->op == OP_ALLREDUCE && v->phase == PHASE_UPDATE && v->mesh_axis == axis &&
           v->param_index >= 0 && g->grads && g->grads[v->param_index] == v->id;
}

int dm_compressed_allreduce(const ir_graph *g, const ir_value *v) { return !g->zero && data_grad_allreduce(g, v); }

int dm_zero_reduces_half(const ir_graph *g, int axis) {
    if (!g->zero || axis < 0 || axis != dm_compress_axis(g)) return 0;
    return g->compress.kind == COMPRESS_BF16 ? 1 : g->compress.kind == COMPRESS_FP16 ? 2 : 0;
}

int dm_zero_half_reduction(const ir_graph *g, const ir_value *v) {
    return data_grad_allreduce(g, v) && dm_zero_reduces_half(g, v->mesh_axis);
}

int64_t dm_topk_keep(const ir_compress *c, int64_t n) {
    int64_t k = (int64_t)floor(c->ratio * (double)n + 0.5);
    return n == 0 ? 0 : k < 1 ? 1 : k > n ? n : k;
}

int dm_powersgd_matrix(const ir_graph *g, const ir_value *grad, int64_t *rows, int64_t *cols) {
    ir_type local = ir_local_type(g, &grad->type);
    int64_t n = ir_numel(&local);
    *cols = local.rank >= 1 ? local.shape[local.rank - 1] : 1;
    *rows = *cols > 0 ? n / *cols : 0;
    int r = g->compress.rank;
    return local.rank >= 2 && (double)r * (double)(*rows + *cols) < (double)*rows * (double)*cols;
}

double dm_compress_sent(const ir_graph *g, const ir_value *v, double *messages) {
    double n = (double)g->axes[v->mesh_axis].size, elems = (double)ir_local_numel(g, &v->type);
    *messages = 2 * (n - 1);
    switch (g->compress.kind) {
    case COMPRESS_BF16:
    case COMPRESS_FP16: return 2.0 * elems * 2 * (n - 1) / n; /* an all-to-all and an all-gather of 2-byte slices */
    case COMPRESS_TOPK:
        /* an all-gather of each rank's values and indices */
        *messages = n - 1;
        return 8.0 * (double)dm_topk_keep(&g->compress, (int64_t)elems) * (n - 1);
    case COMPRESS_POWERSGD: {
        int64_t rows, cols;
        if (!dm_powersgd_matrix(g, v, &rows, &cols)) return 4.0 * elems * 2 * (n - 1) / n;
        *messages = 4 * (n - 1); /* two allreduces: P, then Q */
        return 4.0 * (double)g->compress.rank * (double)(rows + cols) * 2 * (n - 1) / n;
    }
    default: return 4.0 * elems * 2 * (n - 1) / n;
    }
}

double dm_compress_flops(const ir_graph *g, const ir_value *v) {
    double elems = (double)ir_local_numel(g, &v->type);
    switch (g->compress.kind) {
    case COMPRESS_BF16:
    case COMPRESS_FP16: return 4 * elems; /* rounding each value and the sums of this rank's slice */
    case COMPRESS_TOPK: return 6 * elems;  /* the residual's sum, magnitudes, the selection's passes */
    case COMPRESS_POWERSGD: {
        int64_t rows, cols;
        if (!dm_powersgd_matrix(g, v, &rows, &cols)) return 0;
        /* M Q, M^T P, the residual's and the result's P Q^T: four products of 2 rows cols rank */
        return 8.0 * (double)rows * (double)cols * g->compress.rank;
    }
    default: return 0;
    }
}

int64_t dm_compress_state_elems(const ir_graph *g, const ir_value *v) {
    int64_t n = ir_local_numel(g, &v->type), rows, cols;
    switch (g->compress.kind) {
    case COMPRESS_TOPK: return n;
    case COMPRESS_POWERSGD: return n + (dm_powersgd_matrix(g, v, &rows, &cols) ? cols * g->compress.rank : 0);
    default: return 0;
    }
}

/* ---- the plan ---------------------------------------------------------------------------- */

static int64_t align16(int64_t n) { return (n + 15) / 16 * 16; } /* the memory plan's alignment */

/* The scratch of a bucket's reduction, as dmrt_comm.h's _work functions count it. */
static int64_t bucket_work(const ir_graph *g, const dm_compress_bucket *b) {
    int64_t ranks = g->axes[b->axis].size, total = 0;
    if (g->compress.kind == COMPRESS_BF16 || g->compress.kind == COMPRESS_FP16) {
        int64_t slice = (b->elems + ranks - 1) / ranks;
        slice += slice & 1;
        return 2 * ranks * (slice / 2);
    }
    for (int p = b->first; p <= b->last; p++) {
        const ir_value *grad = g->values[g->grads[p]];
        int64_t n = ir_local_numel(g, &grad->type), rows, cols;
        if (g->compress.kind == COMPRESS_TOPK) {
            total += 2 * ranks * dm_topk_keep(&g->compress, n);
        } else {
            total += dm_powersgd_matrix(g, grad, &rows, &cols) ? rows * g->compress.rank : n;
        }
    }
    return total;
}

/* Appends state of `elems` to stage s's ctx->state; returns its offset. Interleaved (mem->rank
 * set), a rank's region holds its chunks' stages one after the other: the state goes after
 * all of them, at the end of the rank's region (the stage's share of it grows alike). */
static int64_t take_state(dm_memory_plan *mem, int stage, int64_t elems) {
    int64_t *top = mem->rank ? &mem->rank[stage % mem->ranks].state_elems
                   : mem->stages > 1 ? &mem->stage[stage].state_elems : &mem->state_elems;
    int64_t at = *top;
    *top += align16(elems);
    if (mem->rank) mem->stage[stage].state_elems += align16(elems);
    if (mem->stages > 1 && *top > mem->state_elems) mem->state_elems = *top;
    return at;
}

int pass_compress(const ir_graph *g, dm_memory_plan *mem, const dm_bucket_plan *buckets, dm_compress_plan *plan) {
    memset(plan, 0, sizeof *plan);
    plan->kind = g->compress.kind;
    if (dm_compress_axis(g) < 0 || !g->grads) return 0;
    for (int lead = 0; lead < g->n_values; lead++) {
        if (buckets->lead[lead] != lead || !dm_compressed_allreduce(g, g->values[lead])) continue;
        dm_compress_bucket b = {.lead = lead, .axis = (int)g->values[lead]->mesh_axis, .stage = g->values[lead]->stage,
                                .first = -1, .residual_at = -1, .q_at = -1};
        for (int p = 0; p < g->n_params; p++) {
            if (g->grads[p] < 0 || buckets->lead[g->grads[p]] != lead) continue;
            if (b.first < 0) b.first = p;
            b.last = p;
        }
        const ir_value *last = g->values[g->grads[b.last]];
        b.grad_begin = mem->offset[g->grads[b.first]];
        b.elems = mem->offset[last->id] + ir_local_numel(g, &last->type) - b.grad_begin;
        if (g->compress.kind == COMPRESS_TOPK || g->compress.kind == COMPRESS_POWERSGD) {
            for (int p = b.first; p <= b.last; p++) {
                int64_t rows, cols;
                if (g->compress.kind == COMPRESS_POWERSGD && dm_powersgd_matrix(g, g->values[g->grads[p]], &rows, &cols))
                    b.q_elems += cols * g->compress.rank;
            }
            b.residual_at = take_state(mem, b.stage, b.elems);
            if (b.q_elems) b.q_at = take_state(mem, b.stage, b.q_elems);
        }
        b.work_elems = bucket_work(g, &b);
        if (b.work_elems > mem->scratch_elems) mem->scratch_elems = b.work_elems;
        plan->bucket = ir_grow(plan->bucket, plan->n_buckets, sizeof *plan->bucket);
        plan->bucket[plan->n_buckets++] = b;
    }
    return 0;
}

const dm_compress_bucket *dm_compress_bucket_of(const dm_compress_plan *plan, int lead) {
    for (int k = 0; plan && k < plan->n_buckets; k++)
        if (plan->bucket[k].lead == lead) return &plan->bucket[k];
    return NULL;
}

void dm_compress_plan_free(dm_compress_plan *plan) {
    free(plan->bucket);
    memset(plan, 0, sizeof *plan);
}
