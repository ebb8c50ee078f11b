/* dialect_cuda_attention.c: the CUDA dialect's fused attention hooks (dialect_cuda.c's table
 * names them): the f32 kernel, or under --precision bf16/fp16 cuDNN's (cg_attention.operands). */
#include <stdio.h>

#include "dialect.h"
#include "dialect_cuda_internal.h"
#include "../runtime/cuda/dmrt_cuda_sizes.h"

/* Heads are one after the other here (k->inner is 1): the dialect has no
 * can.attention_heads_inner, so the heads' transposes stay around the attention. */

/* Fused attention: in f32 runtime/cuda/attention.cu, a thread a row, which needs no scratch
 * (a float, so that the context's layout stays the C target's shape); in bf16 or fp16
 * attention16.cu, cuDNN on 16-bit copies in the scratch (dmrt_cuda_attention16_scratch_bytes). */
static void cuda_attention16(cg_writer *w, const cg_attention *k, int backward) {
    char call[1536];
    int half = k->operands == DT_F16;
    if (backward)
        snprintf(
            call, sizeof call,
            "dmrt_gpu_attention16_backward(ctx->gpu, %d, %s, %s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %s, %d, "
            "%s, %lld, \"%s\"",
            half, k->q, k->k, k->v, k->out, k->lse, k->dout, k->dq, k->dk, k->dv, (long long)k->heads,
            (long long)k->positions, (long long)k->width, k->scale, k->causal, k->work, (long long)(4 * k->work_floats),
            k->name);
    else
        snprintf(
            call, sizeof call,
            "dmrt_gpu_attention16_forward(ctx->gpu, %d, %s, %s, %s, %s, %s, %lld, %lld, %lld, %s, %d, %s, %lld, \"%s\"",
            half, k->q, k->k, k->v, k->out, k->lse, (long long)k->heads, (long long)k->positions, (long long)k->width,
            k->scale, k->causal, k->work, (long long)(4 * k->work_floats), k->name);
    cg_cuda_checked(w, call);
}

void cg_cuda_attention(cg_writer *w, const cg_attention *k) {
    if (k->operands != DT_F32) {
        cuda_attention16(w, k, 0);
        return;
    }
    char call[1024];
    snprintf(call, sizeof call, "dmrt_gpu_attention_forward(ctx->gpu, %s, %s, %s, %s, %s, %lld, %lld, %lld, %s, %d",
             k->q, k->k, k->v, k->out, k->lse, (long long)k->heads, (long long)k->positions, (long long)k->width,
             k->scale, k->causal);
    cg_cuda_checked(w, call);
}

void cg_cuda_attention_grad(cg_writer *w, const cg_attention *k) {
    if (k->operands != DT_F32) {
        cuda_attention16(w, k, 1);
        return;
    }
    char call[1024];
    snprintf(call, sizeof call,
             "dmrt_gpu_attention_backward(ctx->gpu, %s, %s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %s, %d", k->q,
             k->k, k->v, k->out, k->lse, k->dout, k->dq, k->dk, k->dv, (long long)k->heads, (long long)k->positions,
             (long long)k->width, k->scale, k->causal);
    cg_cuda_checked(w, call);
}

int64_t cg_cuda_attention_scratch_floats(int64_t heads, int64_t positions, int64_t width, ir_dtype dtype) {
    if (dtype == DT_F32) return 1;
    int64_t forward = dmrt_cuda_attention16_scratch_bytes(heads, positions, width, 0);
    int64_t backward = dmrt_cuda_attention16_scratch_bytes(heads, positions, width, 1);
    return ((forward > backward ? forward : backward) + 3) / 4;
}
