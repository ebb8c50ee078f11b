/* attention16.cu: the fused attention of --precision bf16/fp16 through cuDNN (cudnn_sdpa.h).
 * The attention op's operands and results stay f32 in the program (its lse too, which the
 * backward reads): this file casts q, k, v (and out, dout) into the 16-bit type in the
 * planned scratch, runs cuDNN's graph there, and casts out (dq, dk, dv) back. The casts
 * read and write each element once, next to the attention's positions^2 work; keeping the
 * op f32 in the IR leaves the C target, the memory plan and the other passes as they are.
 *
 * cuDNN's handle is made at the first call (on the rank's stream) and each shape's plan
 * once, kept in g->sdpa until dmrt_gpu_destroy. Grouped-query attention (k and v with
 * heads / group heads) runs the same graph: the cast repeats k and v to every query head
 * (the 16-bit copies are at q's heads anyway), and the cast back sums dk and dv over each
 * group in f32. With the heads side by side in a row (the _inner calls: a fused gpt.dm
 * attention's [B, T, H, D] operands), the casts read and write that layout and the 16-bit
 * copies have the heads one after the other, so the head split and merge cost nothing
 * beyond the casts; lse is relaid between cuDNN's statistics and the op's in the scratch.
 *
 * Where cuDNN makes no plan for a shape's forward or backward (both are planned at its
 * first call), the shape runs the f32 kernel (attention.cu) on the op's f32 operands in
 * both directions, with one line on stderr saying so; DMRT_CUDNN_ATTENTION=require makes
 * it a failure instead, =off runs the f32 kernel for every shape.
 * Never run on a GPU yet (docs/gpu.md). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudnn_sdpa.h"
#include "dmrt_attention_rows.h"
#include "gpu_internal.h"

/* A shape's plans, forward and backward. The two take one path: where cuDNN makes no plan
 * for either, both run the f32 kernel, so that the backward never recomputes the
 * probabilities from another kernel's lse and out (they differ by the 16-bit rounding). */
typedef struct gpu_sdpa_entry {
    dmrt_sdpa_shape shape;   /* backward 0: the direction is the plan's index */
    dmrt_sdpa_plan plan[2];  /* [forward, backward] */
    int planless;            /* the f32 kernel runs this shape, both directions */
} gpu_sdpa_entry;

/* DMRT_CUDNN_ATTENTION: what a shape cuDNN makes no plan for does (gpu_library_mode's) */
typedef enum { CUDNN_AUTO = GPU_LIBRARY_AUTO, CUDNN_REQUIRE = GPU_LIBRARY_REQUIRE, CUDNN_OFF = GPU_LIBRARY_OFF } cudnn_mode;

struct gpu_sdpa {
    cudnn_mode mode;
    cudnnHandle_t handle;
    gpu_sdpa_entry *entries; /* (n) one a shape */
    int n;
};

/* The same shape, whatever the direction. */
static int same_shape(const dmrt_sdpa_shape *a, const dmrt_sdpa_shape *b) {
    return a->heads == b->heads && a->positions == b->positions && a->width == b->width && a->half == b->half &&
           a->scale == b->scale && a->causal == b->causal;
}

static const char *shape_words(const dmrt_sdpa_shape *s, char *buf, size_t size) {
    snprintf(buf, size, "%s, %lld heads of (%lld, %lld)%s", s->half ? "fp16" : "bf16", (long long)s->heads,
             (long long)s->positions, (long long)s->width, s->backward ? ", backward" : "");
    return buf;
}

/* Both plans of a new entry: 0, or the direction (forward 0, backward 1) cuDNN made none
 * for + 1, the other freed. */
static int make_plans(struct gpu_sdpa *c, gpu_sdpa_entry *e) {
    for (int backward = 0; backward < 2; backward++) {
        dmrt_sdpa_shape s = e->shape;
        s.backward = backward;
        if (dmrt_sdpa_plan_make(&e->plan[backward], c->handle, &s) == 0) continue;
        if (backward) dmrt_sdpa_plan_free(&e->plan[0]);
        return backward + 1;
    }
    return 0;
}

/* The shape's entry, its plans made now if it is new: planless when cuDNN made none for a
 * direction (auto: said once on stderr) or is off. DMRT_OK or the failure (g->error). */
static int entry_of(dmrt_gpu *g, struct gpu_sdpa *c, const dmrt_sdpa_shape *s, const char *name,
                    gpu_sdpa_entry **entry) {
    for (int i = 0; i < c->n; i++)
        if (same_shape(&c->entries[i].shape, s)) {
            *entry = &c->entries[i];
            return DMRT_OK;
        }
    gpu_sdpa_entry *grown = (gpu_sdpa_entry *)realloc(c->entries, (size_t)(c->n + 1) * sizeof *grown);
    if (!grown) return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "attention %s: out of host memory", name);
    c->entries = grown;
    gpu_sdpa_entry *e = &c->entries[c->n];
    memset(e, 0, sizeof *e);
    e->shape = *s;
    e->shape.backward = 0;
    int refused = c->mode == CUDNN_OFF ? 0 : make_plans(c, e);
    if (refused) {
        dmrt_sdpa_plan *p = &e->plan[refused - 1];
        char words[96];
        shape_words(&p->graph.shape, words, sizeof words);
        if (c->mode == CUDNN_REQUIRE) {
            int rc = dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "attention %s (%s): %s", name, words,
                                   p->graph.error);
            dmrt_sdpa_plan_free(p);
            return rc;
        }
        fprintf(stderr,
                "dmrt: attention %s (%s): %s; this shape runs the f32 attention kernel instead, both directions "
                "(DMRT_CUDNN_ATTENTION=require makes this an error)\n",
                name, words, p->graph.error);
        dmrt_sdpa_plan_free(p);
    }
    e->planless = c->mode == CUDNN_OFF || refused;
    c->n++;
    *entry = e;
    return DMRT_OK;
}

/* *plan: the plan of shape s, made now if it is new; NULL where the f32 kernel runs the
 * shape instead (cuDNN made no plan, or DMRT_CUDNN_ATTENTION=off). DMRT_OK or the failure
 * (g->error). */
static int plan_of(dmrt_gpu *g, const dmrt_sdpa_shape *s, const char *name, dmrt_sdpa_plan **plan) {
    *plan = NULL;
    if (!g->sdpa) {
        int mode = gpu_library_mode_from_env("DMRT_CUDNN_ATTENTION");
        if (mode < 0)
            return dmrt_gpu_fail(g, DMRT_ERR_ARG, __FILE__, __LINE__,
                                 "attention %s: DMRT_CUDNN_ATTENTION=%s: expected auto, require or off", name,
                                 getenv("DMRT_CUDNN_ATTENTION"));
        if (!(g->sdpa = (struct gpu_sdpa *)calloc(1, sizeof *g->sdpa)))
            return dmrt_gpu_fail(g, DMRT_ERR_NOMEM, __FILE__, __LINE__, "attention %s: out of host memory", name);
        g->sdpa->mode = (cudnn_mode)mode;
    }
    struct gpu_sdpa *c = g->sdpa;
    if (!c->handle && c->mode != CUDNN_OFF) {
        cudnnStatus_t st = cudnnCreate(&c->handle);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnSetStream(c->handle, g->stream);
        if (st != CUDNN_STATUS_SUCCESS) { /* no half-made handle kept: the next call tries again */
            if (c->handle) (void)cudnnDestroy(c->handle);
            c->handle = NULL;
            if (c->mode == CUDNN_REQUIRE)
                return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "attention %s: cuDNN: %s", name,
                                     cudnnGetErrorString(st));
            /* auto: no cuDNN, every shape on the f32 kernel */
            fprintf(stderr, "dmrt: attention %s: cuDNN: %s; every attention runs the f32 attention kernel instead\n",
                    name, cudnnGetErrorString(st));
            c->mode = CUDNN_OFF;
        }
    }
    gpu_sdpa_entry *e = NULL;
    int rc = entry_of(g, c, s, name, &e);
    if (rc == DMRT_OK && !e->planless) *plan = &e->plan[s->backward ? 1 : 0];
    return rc;
}

void dmrt_gpu_sdpa_destroy(dmrt_gpu *g) {
    if (!g->sdpa) return;
    for (int i = 0; i < g->sdpa->n; i++)
        if (!g->sdpa->entries[i].planless)
            for (int d = 0; d < 2; d++) dmrt_sdpa_plan_free(&g->sdpa->entries[i].plan[d]);
    if (g->sdpa->handle) (void)cudnnDestroy(g->sdpa->handle);
    free(g->sdpa->entries);
    free(g->sdpa);
    g->sdpa = NULL;
}

template <typename T>
__device__ static T to_narrow(float x);
template <>
__device__ float to_narrow<float>(float x) {
    return x;
}
template <>
__device__ __nv_bfloat16 to_narrow<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
template <>
__device__ __half to_narrow<__half>(float x) {
    return __float2half_rn(x);
}

/* A cast's layout: elements of (heads, positions, width), the 16-bit side's heads one after
 * the other (as cuDNN takes them), the f32 side's with `inner` heads side by side in a row
 * (inner 1: the same order, the plain copy). */
typedef struct cast_layout {
    int64_t inner, positions, width;
} cast_layout;

__device__ static int64_t f32_index(int64_t i, cast_layout at) {
    return at.inner == 1 ? i : dmrt_attention_inner_index(i, at.inner, at.positions, at.width);
}

template <typename T>
__global__ static void narrow_kernel(const float *x, T *y, int64_t n, cast_layout at) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = to_narrow<T>(x[f32_index(i, at)]);
}

template <typename T>
__global__ static void widen_kernel(const T *x, float *y, int64_t n, cast_layout at) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[f32_index(i, at)] = (float)x[i];
}

/* Grouped-query attention's k and v: the n elements of y (query heads of `head` elements)
 * each from its kv head of x (head h from x's head h / group): repeat_kv folded into the cast. */
template <typename T>
__global__ static void narrow_repeat_kernel(const float *x, T *y, int64_t n, int64_t head, int64_t group) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = to_narrow<T>(x[(i / head / group) * head + i % head]);
}

/* And their gradients: each of y's n / group elements the f32 sum over its group's heads of
 * x, in head order (the sum repeat_kv's backward takes). */
template <typename T>
__global__ static void widen_sum_kernel(const T *x, float *y, int64_t n_kv, int64_t head, int64_t group) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_kv; i += (int64_t)gridDim.x * blockDim.x) {
        const T *first = x + (i / head) * group * head + i % head;
        float sum = (float)first[0];
        for (int64_t r = 1; r < group; r++) sum += (float)first[r * head];
        y[i] = sum;
    }
}

/* The n elements of the 16-bit copy y from the floats x (laid out as `at` says); with
 * group > 1 x is at kv heads (n / group elements, heads one after the other), each
 * repeated to its group's heads. */
template <typename T>
static void narrow_as(dmrt_gpu *g, const float *x, void *y, int64_t n, cast_layout at, int64_t group) {
    if (group > 1)
        narrow_repeat_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(x, (T *)y, n, at.positions * at.width, group);
    else
        narrow_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>(x, (T *)y, n, at);
}

/* The floats x from the n elements of the 16-bit copy y; with group > 1 x is at kv heads,
 * each the f32 sum of its group's heads of y. */
template <typename T>
static void widen_as(dmrt_gpu *g, float *x, const void *y, int64_t n, cast_layout at, int64_t group) {
    if (group > 1)
        widen_sum_kernel<<<gpu_blocks(n / group, 256), 256, 0, g->stream>>>((const T *)y, x, n / group,
                                                                            at.positions * at.width, group);
    else
        widen_kernel<<<gpu_blocks(n, 256), 256, 0, g->stream>>>((const T *)y, x, n, at);
}

static int narrow16(dmrt_gpu *g, int half, const float *x, void *y, int64_t n, cast_layout at, int64_t group) {
    if (half)
        narrow_as<__half>(g, x, y, n, at, group);
    else
        narrow_as<__nv_bfloat16>(g, x, y, n, at, group);
    LAUNCH_CHECK(g, "attention16 cast");
    return DMRT_OK;
}

static int widen16(dmrt_gpu *g, int half, float *x, const void *y, int64_t n, cast_layout at, int64_t group) {
    if (half)
        widen_as<__half>(g, x, y, n, at, group);
    else
        widen_as<__nv_bfloat16>(g, x, y, n, at, group);
    LAUNCH_CHECK(g, "attention16 cast");
    return DMRT_OK;
}

/* The scratch: count 16-bit copies of n elements, cuDNN's statistics (f32, a row each, the
 * heads one after the other), then the graph's own workspace and the engine's. */
typedef struct attention16_scratch {
    void *copies[8];
    float *stats;
    char *workspace;
} attention16_scratch;

/* The scratch laid out (dmrt_cuda_attention16_scratch_bytes' terms). Fails (naming the
 * attention) when cuDNN's figure does not fit. */
static int lay_out(dmrt_gpu *g, const dmrt_sdpa_plan *p, void *work, int64_t work_bytes, int count, int64_t n,
                   attention16_scratch *at, const char *name) {
    const dmrt_sdpa_shape *s = &p->graph.shape;
    int64_t part = (2 * n + 255) / 256 * 256, stats = (4 * s->heads * s->positions + 255) / 256 * 256;
    int64_t own = dmrt_sdpa_own_workspace_bytes(s), need = count * part + stats + own + p->engine_workspace;
    if (need > work_bytes)
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__,
                             "attention %s: cuDNN's engine needs %lld bytes of workspace; with the 16-bit copies that "
                             "is %lld bytes, more than the %lld planned (dmrt_cuda_attention16_scratch_bytes)",
                             name, (long long)p->engine_workspace, (long long)need, (long long)work_bytes);
    for (int i = 0; i < count; i++) at->copies[i] = (char *)work + i * part;
    at->stats = (float *)((char *)work + count * part);
    at->workspace = (char *)work + count * part + stats;
    return DMRT_OK;
}

/* The statistics cuDNN reads or writes: lse itself with the heads one after the other;
 * with them side by side the scratch's, relaid from lse (into 1) or, after the forward,
 * into it (relay_stats). */
static float *stats_for(const float *lse, const attention16_scratch *at, cast_layout layout) {
    return layout.inner == 1 ? (float *)lse : at->stats;
}

static int relay_stats(dmrt_gpu *g, float *lse, const float *stats, int64_t rows, cast_layout layout, int into_lse) {
    if (layout.inner == 1) return DMRT_OK;
    cast_layout rows_at = {layout.inner, layout.positions, 1}; /* an lse is an operand of width 1 */
    if (into_lse)
        widen_kernel<float><<<gpu_blocks(rows, 256), 256, 0, g->stream>>>(stats, lse, rows, rows_at);
    else
        narrow_kernel<float><<<gpu_blocks(rows, 256), 256, 0, g->stream>>>(lse, (float *)stats, rows, rows_at);
    LAUNCH_CHECK(g, "attention16 statistics");
    return DMRT_OK;
}

/* The plan of shape s, the scratch laid out for `count` 16-bit copies of n elements, and
 * the n_in f32 inputs (q, k, v, then out and dout) cast into the first copies, k and v
 * repeated to every query head of their group: what both directions start with. */
static int stage_inputs(dmrt_gpu *g, const dmrt_sdpa_shape *s, int64_t group, cast_layout layout, const char *name,
                        void *work, int64_t work_bytes, int count, const float *const *in, int n_in, int64_t n,
                        dmrt_sdpa_plan **p, attention16_scratch *at) {
    int rc = plan_of(g, s, name, p);
    if (rc != DMRT_OK || !*p) return rc; /* no plan: the caller runs the f32 kernel */
    rc = lay_out(g, *p, work, work_bytes, count, n, at, name);
    for (int i = 0; i < n_in && rc == DMRT_OK; i++)
        rc = narrow16(g, s->half, in[i], at->copies[i], n, layout, i == 1 || i == 2 ? group : 1);
    return rc;
}

/* Both layouts: group > 1 (grouped-query attention) takes inner 1. */
static int attention16_forward(dmrt_gpu *g, int half, const float *q, const float *k, const float *v, float *out,
                               float *lse, int64_t heads, int64_t group, int64_t inner, int64_t positions,
                               int64_t width, float scale, int causal, void *work, int64_t work_bytes,
                               const char *name) {
    GPU_ENTER(g);
    ARG_CHECK(g, dmrt_attention_layout_ok(heads, group, inner, positions, width) && work);
    const int64_t n = heads * positions * width;
    if (n == 0) return DMRT_OK;
    dmrt_sdpa_shape s = {heads, positions, width, half, scale, causal, 0};
    const cast_layout layout = {inner, positions, width};
    dmrt_sdpa_plan *p = NULL;
    attention16_scratch at;
    memset(&at, 0, sizeof at);
    const float *in[3] = {q, k, v};
    int rc = stage_inputs(g, &s, group, layout, name, work, work_bytes, 4, in, 3, n, &p, &at);
    if (rc != DMRT_OK) return rc;
    if (!p) /* planless: the f32 kernel, in this layout */
        return inner > 1 ? dmrt_gpu_attention_forward_inner(g, q, k, v, out, lse, heads, inner, positions, width,
                                                            scale, causal)
                         : dmrt_gpu_attention_forward_grouped(g, q, k, v, out, lse, heads, group, positions, width,
                                                              scale, causal);
    float *stats = stats_for(lse, &at, layout);
    void *data[DMRT_SDPA_UIDS] = {0};
    data[DMRT_SDPA_Q] = at.copies[0], data[DMRT_SDPA_K] = at.copies[1], data[DMRT_SDPA_V] = at.copies[2];
    data[DMRT_SDPA_OUT] = at.copies[3], data[DMRT_SDPA_STATS] = stats;
    if (dmrt_sdpa_plan_run(p, g->sdpa->handle, data, at.workspace))
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "attention %s: %s", name, p->graph.error);
    rc = relay_stats(g, lse, stats, heads * positions, layout, 1);
    return rc == DMRT_OK ? widen16(g, half, out, at.copies[3], n, layout, 1) : rc;
}

static int attention16_backward(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv,
                                int64_t heads, int64_t group, int64_t inner, int64_t positions, int64_t width,
                                float scale, int causal, void *work, int64_t work_bytes, const char *name) {
    GPU_ENTER(g);
    ARG_CHECK(g, dmrt_attention_layout_ok(heads, group, inner, positions, width) && work);
    const int64_t n = heads * positions * width, rows = heads * positions;
    if (n == 0) return DMRT_OK;
    dmrt_sdpa_shape s = {heads, positions, width, half, scale, causal, 1};
    const cast_layout layout = {inner, positions, width};
    dmrt_sdpa_plan *p = NULL;
    attention16_scratch at;
    memset(&at, 0, sizeof at);
    const float *in[5] = {q, k, v, out, dout};
    int rc = stage_inputs(g, &s, group, layout, name, work, work_bytes, 8, in, 5, n, &p, &at);
    if (rc != DMRT_OK) return rc;
    if (!p)
        return inner > 1 ? dmrt_gpu_attention_backward_inner(g, q, k, v, out, lse, dout, dq, dk, dv, heads, inner,
                                                             positions, width, scale, causal)
                         : dmrt_gpu_attention_backward_grouped(g, q, k, v, out, lse, dout, dq, dk, dv, heads, group,
                                                               positions, width, scale, causal);
    float *stats = stats_for(lse, &at, layout);
    rc = relay_stats(g, (float *)lse, stats, rows, layout, 0);
    if (rc != DMRT_OK) return rc;
    /* the graph's own workspace (cudnn_sdpa.h): rowsum, then dq in f32, which starts at 0 */
    char *rowsum = at.workspace, *dq_f32 = at.workspace + (4 * rows + 255) / 256 * 256;
    CUDA_CHECK(g, cudaMemsetAsync(dq_f32, 0, (size_t)(4 * n), g->stream));
    void *data[DMRT_SDPA_UIDS] = {0};
    data[DMRT_SDPA_Q] = at.copies[0], data[DMRT_SDPA_K] = at.copies[1], data[DMRT_SDPA_V] = at.copies[2];
    data[DMRT_SDPA_OUT] = at.copies[3], data[DMRT_SDPA_DOUT] = at.copies[4], data[DMRT_SDPA_DQ] = at.copies[5];
    data[DMRT_SDPA_DK] = at.copies[6], data[DMRT_SDPA_DV] = at.copies[7];
    data[DMRT_SDPA_STATS] = stats, data[DMRT_SDPA_ROWSUM] = rowsum, data[DMRT_SDPA_DQ_F32] = dq_f32;
    if (dmrt_sdpa_plan_run(p, g->sdpa->handle, data, at.workspace))
        return dmrt_gpu_fail(g, DMRT_ERR_DEVICE, __FILE__, __LINE__, "attention %s: %s", name, p->graph.error);
    /* dq from the graph's f32 sum, not from its 16-bit copy: no rounding the f32 dq never
     * had (dk and dv have no f32 form in the graph; theirs stays) */
    widen_as<float>(g, dq, dq_f32, n, layout, 1);
    LAUNCH_CHECK(g, "attention16 dq");
    float *grads[2] = {dk, dv};
    for (int i = 0; i < 2 && rc == DMRT_OK; i++) rc = widen16(g, half, grads[i], at.copies[6 + i], n, layout, group);
    return rc;
}

int dmrt_gpu_attention16_forward_grouped(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                         float *out, float *lse, int64_t heads, int64_t group, int64_t positions,
                                         int64_t width, float scale, int causal, void *work, int64_t work_bytes,
                                         const char *name) {
    return attention16_forward(g, half, q, k, v, out, lse, heads, group, 1, positions, width, scale, causal, work,
                               work_bytes, name);
}

int dmrt_gpu_attention16_backward_grouped(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                          const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                          float *dv, int64_t heads, int64_t group, int64_t positions, int64_t width,
                                          float scale, int causal, void *work, int64_t work_bytes, const char *name) {
    return attention16_backward(g, half, q, k, v, out, lse, dout, dq, dk, dv, heads, group, 1, positions, width,
                                scale, causal, work, work_bytes, name);
}

int dmrt_gpu_attention16_forward_inner(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                       float *out, float *lse, int64_t heads, int64_t inner, int64_t positions,
                                       int64_t width, float scale, int causal, void *work, int64_t work_bytes,
                                       const char *name) {
    return attention16_forward(g, half, q, k, v, out, lse, heads, 1, inner, positions, width, scale, causal, work,
                               work_bytes, name);
}

int dmrt_gpu_attention16_backward_inner(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                        const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                        float *dv, int64_t heads, int64_t inner, int64_t positions, int64_t width,
                                        float scale, int causal, void *work, int64_t work_bytes, const char *name) {
    return attention16_backward(g, half, q, k, v, out, lse, dout, dq, dk, dv, heads, 1, inner, positions, width,
                                scale, causal, work, work_bytes, name);
}

int dmrt_gpu_attention16_forward(dmrt_gpu *g, int half, const float *q, const float *k, const float *v, float *out,
                                 float *lse, int64_t heads, int64_t positions, int64_t width, float scale, int causal,
                                 void *work, int64_t work_bytes, const char *name) {
    return attention16_forward(g, half, q, k, v, out, lse, heads, 1, 1, positions, width, scale, causal, work,
                               work_bytes, name);
}

int dmrt_gpu_attention16_backward(dmrt_gpu *g, int half, const float *q, const float *k, const float *v,
                                  const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                  float *dv, int64_t heads, int64_t positions, int64_t width, float scale, int causal,
                                  void *work, int64_t work_bytes, const char *name) {
    return attention16_backward(g, half, q, k, v, out, lse, dout, dq, dk, dv, heads, 1, 1, positions, width, scale,
                                causal, work, work_bytes, name);
}
