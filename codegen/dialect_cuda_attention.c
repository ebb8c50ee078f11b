/* dialect_cuda_attention.c: the CUDA dialect's fused attention hooks (dialect_cuda.c's table
 * names them): the f32 kernel, or under --precision bf16/fp16 cuDNN's (cg_attention.operands). */
#include <stdio.h>

#include "dialect.h"
#include "dialect_cuda_internal.h"
#include "../runtime/cuda/dmrt_cuda_sizes.h"

/* The dialect has can.attention_heads_inner: where the fusion took the heads' transposes
 * in (k->inner > 1, the heads side by side in a row) the _inner calls take inner after the
 * heads. It has can.attention_kv_groups: under grouped-query attention (k->group > 1) k,
 * v, dk and dv have heads / group heads and the _grouped calls take the group after the
 * heads. The fusion makes at most one of the two. */

/* The calls' name suffix, and their "heads, " argument: "_inner" and "heads, inner, ",
 * "_grouped" and "heads, group, ", or none. */
static const char *heads_and_group(char *out, size_t size, const cg_attention *k) {
    if (k->inner > 1) {
        snprintf(out, size, "%lld, %lld, ", (long long)k->heads, (long long)k->inner);
        return "_inner";
    }
    if (k->group > 1) {
        snprintf(out, size, "%lld, %lld, ", (long long)k->heads, (long long)k->group);
        return "_grouped";
    }
    snprintf(out, size, "%lld, ", (long long)k->heads);
    return "";
}

/* Fused attention: in f32 runtime/cuda/attention.cu, a thread a row, which needs no scratch
 * (a float, so that the context's layout stays the C target's shape); in bf16 or fp16
 * attention16.cu, cuDNN on 16-bit copies in the scratch (dmrt_cuda_attention16_scratch_bytes). */
static void cuda_attention16(cg_writer *w, const cg_attention *k, int backward) {
    char call[1536], heads[48];
    int half = k->operands == DT_F16;
    const char *grouped = heads_and_group(heads, sizeof heads, k);
    if (backward)
        snprintf(call, sizeof call,
                 "dmrt_gpu_attention16_backward%s(ctx->gpu, %d, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s%lld, %lld, %s, "
                 "%d, %s, %lld, \"%s\"",
                 grouped, half, k->q, k->k, k->v, k->out, k->lse, k->dout, k->dq, k->dk, k->dv, heads,
                 (long long)k->positions, (long long)k->width, k->scale, k->causal, k->work,
                 (long long)(4 * k->work_floats), k->name);
    else
        snprintf(call, sizeof call,
                 "dmrt_gpu_attention16_forward%s(ctx->gpu, %d, %s, %s, %s, %s, %s, %s%lld, %lld, %s, %d, %s, %lld, "
                 "\"%s\"",
                 grouped, half, k->q, k->k, k->v, k->out, k->lse, heads, (long long)k->positions,
                 (long long)k->width, k->scale, k->causal, k->work, (long long)(4 * k->work_floats), k->name);
    cg_cuda_checked(w, call);
}

void cg_cuda_attention(cg_writer *w, const cg_attention *k) {
    if (k->operands != DT_F32) {
        cuda_attention16(w, k, 0);
        return;
    }
    char call[1024], heads[48];
    const char *grouped = heads_and_group(heads, sizeof heads, k);
    snprintf(call, sizeof call, "dmrt_gpu_attention_forward%s(ctx->gpu, %s, %s, %s, %s, %s, %s%lld, %lld, %s, %d",
             grouped, k->q, k->k, k->v, k->out, k->lse, heads, (long long)k->positions,
             (long long)k->width, k->scale, k->causal);
    cg_cuda_checked(w, call);
}

void cg_cuda_attention_grad(cg_writer *w, const cg_attention *k) {
    if (k->operands != DT_F32) {
        cuda_attention16(w, k, 1);
        return;
    }
    char call[1024], heads[48];
    const char *grouped = heads_and_group(heads, sizeof heads, k);
    snprintf(call, sizeof call,
             "dmrt_gpu_attention_backward%s(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s%lld, %lld, %s, %d",
             grouped, k->q, k->k, k->v, k->out, k->lse, k->dout, k->dq, k->dk, k->dv, heads,
             (long long)k->positions, (long long)k->width, k->scale, k->causal);
    cg_cuda_checked(w, call);
}

int64_t cg_cuda_attention_scratch_floats(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype) {
    if (dtype == DT_F32) return 1;
    int64_t forward = dmrt_cuda_attention16_scratch_bytes(heads, positions, width, 0);
    int64_t backward = dmrt_cuda_attention16_scratch_bytes(heads, positions, width, 1);
    return ((forward > backward ? forward : backward) + 3) / 4;
}
