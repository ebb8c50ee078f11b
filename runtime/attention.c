/* attention.c: the fused attention's kernels (attention_kernels.h) compiled for one
 * instruction set, DMRT_ATTENTION_ISA as dmrt_attention.h names it for the flags this file
 * is built with (runtime/meson.build builds it once per set, each with its own flags, into
 * libdmrt): dmrt_attention_forward_<isa> and the rest. */
#include "attention_kernels.h"

void DMRT_ATTENTION_NAME_(dmrt_attention_forward, DMRT_ATTENTION_ISA)(
    const float *q, const float *k, const float *v, float *out, float *lse, int64_t heads, int64_t inner,
    int64_t positions, int64_t width, float scale, int causal, int operands, int threads, float *work) {
    dmrt_attention_forward_tiled_(q, k, v, out, lse, heads, inner, positions, width, scale, causal, operands, threads,
                                  work);
}

void DMRT_ATTENTION_NAME_(dmrt_attention_forward_grouped, DMRT_ATTENTION_ISA)(
    const float *q, const float *k, const float *v, float *out, float *lse, int64_t heads, int64_t group,
    int64_t positions, int64_t width, float scale, int causal, int operands, int threads, float *work) {
    dmrt_attention_forward_grouped_tiled_(q, k, v, out, lse, heads, group, positions, width, scale, causal, operands,
                                          threads, work);
}

void DMRT_ATTENTION_NAME_(dmrt_attention_backward, DMRT_ATTENTION_ISA)(
    const float *q, const float *k, const float *v, const float *out, const float *lse, const float *dout, float *dq,
    float *dk, float *dv, int64_t heads, int64_t inner, int64_t positions, int64_t width, float scale, int causal,
    int operands, int threads, float *work) {
    dmrt_attention_backward_tiled_(q, k, v, out, lse, dout, dq, dk, dv, heads, inner, positions, width, scale, causal,
                                   operands, threads, work);
}

void DMRT_ATTENTION_NAME_(dmrt_attention_backward_grouped, DMRT_ATTENTION_ISA)(
    const float *q, const float *k, const float *v, const float *out, const float *lse, const float *dout, float *dq,
    float *dk, float *dv, int64_t heads, int64_t group, int64_t positions, int64_t width, float scale, int causal,
    int operands, int threads, float *work) {
    dmrt_attention_backward_grouped_tiled_(q, k, v, out, lse, dout, dq, dk, dv, heads, group, positions, width, scale,
                                           causal, operands, threads, work);
}
